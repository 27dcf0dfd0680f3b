"""Bad input: one clear line on stderr, a non-zero exit, no traceback; nothing the user wrote is touched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import s2d2
from conftest import SDAR_FIXTURE, STAT_KEYS, assert_one_line_error, run_cli
from s2d2.errors import ConfigError, ModelLoadError, PromptError


def copy_fixture(tmp_path, name="model", **config_changes):
    dst = tmp_path / name
    shutil.copytree(SDAR_FIXTURE, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in config_changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module", autouse=True)
def _need_fixture():
    if not SDAR_FIXTURE.is_dir():
        pytest.skip("conformance fixtures not available")


def test_missing_path(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(tmp_path / "nope"))
    assert_one_line_error(code, err, "does not exist")


def test_directory_without_config(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(tmp_path))
    assert_one_line_error(code, err, "config.json")


def test_unsupported_model_type(capsys, tmp_path):
    d = copy_fixture(tmp_path, model_type="llama", architectures=["LlamaForCausalLM"], auto_map=None)
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "unsupported model_type 'llama'")


def test_config_without_mask_token(capsys, tmp_path):
    d = copy_fixture(tmp_path, mask_token_id=None)
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "mask_token_id")


def test_prompt_longer_than_context(capsys, tmp_path):
    d = copy_fixture(tmp_path, max_position_embeddings=16)
    prompt = " ".join(str(i) for i in range(20))
    code, _, err = run_cli(capsys, "generate", prompt, "--model", str(d))
    assert_one_line_error(code, err, "prompt is too long", "20 tokens", "16")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (
            ["--policy", "hysteresis", "--set", "hysteresis_on=-5", "--set", "hysteresis_off=-5"],
            "hysteresis_on",
        ),
        (["--threshold", "0"], "threshold"),
        (["--threshold", "1.01"], "threshold"),
        (["--block-size", "0"], "block_size"),
        (["--block-size", "4", "--steps", "5"], "steps (5) cannot exceed block_size (4)"),
        (["--decoder", "beam"], "invalid decoder 'beam'"),
        (["--policy", "sometimes"], "invalid policy"),
        (["--preset", "fastest"], "unknown preset"),
        (["--set", "nonsense=1"], "unknown decoding setting"),
        (["--top-p", "0"], "top_p"),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_invalid_settings(capsys, args, fragment):
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(SDAR_FIXTURE), *args)
    assert_one_line_error(code, err, fragment)


def test_text_prompt_without_tokenizer(capsys):
    code, _, err = run_cli(capsys, "generate", "hello world", "--model", str(SDAR_FIXTURE))
    assert_one_line_error(code, err, "no tokenizer")


def test_pickled_weights_are_not_loaded(capsys, tmp_path):
    d = copy_fixture(tmp_path)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "no safetensors weights", "pickled")


def test_broken_weights(capsys, tmp_path):
    d = copy_fixture(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 3])
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "cannot read weights")


def test_weights_not_matching_config(capsys, tmp_path):
    d = copy_fixture(tmp_path, hidden_size=32)
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "do not match the config")


def test_bad_json_config(capsys, tmp_path):
    d = copy_fixture(tmp_path)
    (d / "config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert_one_line_error(code, err, "not valid JSON")


def test_user_files_untouched(capsys, tmp_path):
    d = copy_fixture(tmp_path, mask_token_id=None)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    run_cli(capsys, "generate", "1 2 3", "--model", str(d))
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_library_raises_typed_errors(tmp_path):
    with pytest.raises(ModelLoadError):
        s2d2.load(tmp_path / "missing")
    m = s2d2.load(SDAR_FIXTURE)
    with pytest.raises(ConfigError):
        m.generate([1, 2], max_new_tokens=0)
    with pytest.raises(PromptError):
        m.generate([])
    with pytest.raises(PromptError):
        m.generate([509, 1])  # the mask token
    with pytest.raises(PromptError):
        m.generate([100000])


def test_console_script_end_to_end(tmp_path):
    """The installed command prints one line and no traceback (a real process, not in-process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "s2d2.cli", "generate", "1 2", "--model", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: model path does not exist")
    assert "Traceback" not in proc.stderr


def test_generate_json_contract(capsys):
    code, out, _ = run_cli(
        capsys,
        "generate",
        "17 42 101",
        "--model",
        str(SDAR_FIXTURE),
        "--max-new-tokens",
        "6",
        "--json",
        "--decoder",
        "s2d2",
        "--block-size",
        "4",
    )
    assert code == 0
    obj = json.loads(out)
    assert set(obj) >= {"text", "token_ids", "stats"}
    assert set(obj["stats"]) >= STAT_KEYS
    assert len(obj["token_ids"]) == obj["stats"]["generated_tokens"] <= 6
    assert obj["stats"]["nfe"] == sum(
        obj["stats"][k] for k in ("nfe_prefill", "nfe_draft", "nfe_verify", "nfe_commit")
    )

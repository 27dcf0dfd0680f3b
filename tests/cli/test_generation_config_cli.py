"""``--generation-config`` and ``--block-size`` on ``s2d2 generate``: the checkpoint's sampling defaults
apply unless turned off (vLLM's spelling ``vllm``, or ``off``), and a bad value is one line."""

from __future__ import annotations

import json
import shutil

import pytest

import s2d2
from conftest import FIXTURES, run_cli

GENERATION_CONFIG = {"temperature": 0.9, "top_k": 8, "top_p": 0.9}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    if not (FIXTURES / "sdar").is_dir():
        pytest.skip(f"conformance fixtures not found in {FIXTURES}")
    path = tmp_path_factory.mktemp("gen_cli") / "sdar"
    shutil.copytree(FIXTURES / "sdar", path)
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return path


def _generate(capsys, checkpoint, *extra: str) -> list[int]:
    args = ("generate", "1 2 3", "--ids", "--json", "--model", str(checkpoint), "--max-new-tokens", "12")
    code, out, err = run_cli(capsys, *args, "--seed", "4", "--set", "ignore_eos=true", *extra)
    assert code == 0, err
    return json.loads(out)["token_ids"]


def test_generate_samples_with_the_checkpoint_defaults_unless_turned_off(capsys, checkpoint):
    model = s2d2.load(checkpoint, device="cpu", dtype="fp32")
    kw = dict(max_new_tokens=12, seed=4, ignore_eos=True)
    sampled = model.generate([1, 2, 3], **kw).token_ids
    greedy = model.generate([1, 2, 3], temperature=0.0, **kw).token_ids
    assert sampled != greedy  # the defaults sample (temperature 0.9)
    assert _generate(capsys, checkpoint, "--device", "cpu", "--dtype", "fp32") == sampled
    for off in ("vllm", "off"):
        assert (
            _generate(capsys, checkpoint, "--device", "cpu", "--dtype", "fp32", "--generation-config", off)
            == greedy
        )


def test_a_bad_generation_config_is_one_line(capsys, checkpoint):
    code, _, err = run_cli(
        capsys, "generate", "1 2", "--ids", "--model", str(checkpoint), "--generation-config", "often"
    )
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(
        "error: generation_config must be auto, vllm, off or a folder holding generation_config.json"
    )

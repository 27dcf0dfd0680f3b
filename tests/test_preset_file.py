"""Preset files (``--preset PATH.json``) and a checkpoint's own ``s2d2_preset.json``."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import assert_one_line_error, run_cli, tiny_model_path
from s2d2.config import DecodeConfig
from s2d2.errors import ConfigError
from s2d2.presets import MODEL_PRESET_FILE, PresetFile, read_preset_file, write_preset_file

SETTINGS = {"decoder": "s2d2", "block_size": 8, "policy": "score", "score": "dynamic", "threshold": 0.7}


def _write(path, obj) -> str:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def test_build_reads_a_preset_file_and_explicit_settings_win(tmp_path):
    path = _write(tmp_path / "fast.json", {"name": "fast", "settings": SETTINGS, "dev": {"accuracy": 0.6}})
    cfg = DecodeConfig.build(preset=path)
    assert (cfg.block_size, cfg.policy, cfg.score, cfg.threshold) == (8, "score", "dynamic", 0.7)
    assert DecodeConfig.build(preset=path, block_size=4).block_size == 4
    # a file named without .json is read too, when it exists
    other = tmp_path / "preset-no-suffix"
    shutil.copy(path, other)
    assert DecodeConfig.build(preset=str(other)).threshold == 0.7


def test_write_then_read_round_trips(tmp_path):
    p = PresetFile("x", dict(SETTINGS), {"model": "m"}, {"accuracy": 0.5}, {"accuracy": 0.6})
    back = read_preset_file(write_preset_file(p, tmp_path / "x.json"))
    assert back == p
    assert back.to_json() == {"name": "x", "settings": SETTINGS, "tuned_on": {"model": "m"},
                              "dev": {"accuracy": 0.5}, "ar": {"accuracy": 0.6}}  # fmt: skip


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"name": "x", "settings": {', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"name": "x", "settings": {}, "speed": 3}, "unknown key 'speed'"),
        ({"name": "x"}, 'missing key "settings"'),
        ({"settings": {"block_sz": 8}}, "unknown decoding setting 'block_sz'"),
        ({"settings": {"threshold": 3.0}}, "invalid settings"),
        ({"settings": {"block_size": "8"}}, "invalid settings"),
    ],
)
def test_bad_preset_files_are_one_line_errors_naming_the_file(tmp_path, content, fragment):
    path = _write(tmp_path / "bad.json", content)
    with pytest.raises(ConfigError) as info:
        DecodeConfig.build(preset=path)
    msg = str(info.value)
    assert "\n" not in msg and path in msg and fragment in msg, msg


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        DecodeConfig.build(preset=str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="unknown preset 'fastest'"):
        DecodeConfig.build(preset="fastest")


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_cli_reports_a_bad_preset_file_in_one_line(capsys, tmp_path):
    bad = _write(tmp_path / "bad.json", {"name": "x", "settings": {}, "extra": 1})
    code, _, err = run_cli(capsys, "generate", "Tom has 3 apples.", "--preset", bad)
    assert_one_line_error(code, err, "preset file", "bad.json", "unknown key 'extra'")
    code, _, err = run_cli(capsys, "bench", "--n", "1", "--grid", "quick", "--preset", bad)
    assert_one_line_error(code, err, "bad.json")


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_checkpoint_preset_is_the_models_default(tmp_path):
    import s2d2

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_path(), ckpt)
    _write(ckpt / MODEL_PRESET_FILE, {"name": "own", "settings": SETTINGS})
    m = s2d2.load(ckpt)
    assert m.preset is not None and m.preset.name == "own"
    cfg = m.make_config()
    assert (cfg.block_size, cfg.policy, cfg.threshold) == (8, "score", 0.7)
    assert m.make_config(threshold=0.9).threshold == 0.9  # explicit settings win
    lossless = m.make_config(preset="lossless")  # an explicit preset replaces the model's
    assert (lossless.block_size, lossless.policy, lossless.threshold) == (4, "always", 0.9)
    assert s2d2.load(ckpt, use_preset=False).make_config().block_size == 4
    # a broken model preset fails the load in one line naming the file
    _write(ckpt / MODEL_PRESET_FILE, "{")
    with pytest.raises(ConfigError, match=MODEL_PRESET_FILE):
        s2d2.load(ckpt)

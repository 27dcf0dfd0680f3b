"""``s2d2 generate --model <an SDAR-MoE checkpoint>`` (written by the tests, :mod:`sdar_moe_fixture`): the
family is detected from its published config, the lossless presets (the planner's ``lossless-auto``
too) reproduce AR token for token, the
paper's SDAR presets run, and a broken checkpoint is a one-line error."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from conftest import STAT_KEYS, assert_one_line_error, run_cli
from sdar_moe_fixture import make_random_sdar_moe, sdar_moe_checkpoint

PROMPT = "17 42 101 7 250 3 88 199 5"


def generate_json(capsys, *args, model=None):
    model = str(model or sdar_moe_checkpoint())
    code, out, err = run_cli(capsys, "generate", PROMPT, "--model", model, "--ids", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_lossless_presets_equal_ar(capsys):
    common = ("--max-new-tokens", "16", "--set", "ignore_eos=true")
    ar = generate_json(capsys, "--decoder", "ar", *common)
    assert len(ar["token_ids"]) == 16 and set(ar["stats"]) >= STAT_KEYS
    for args in (("--preset", "lossless", "--block-size", "4"), ("--preset", "lossless-fused"),
                 ("--preset", "lossless", "--block-size", "8"), ("--preset", "lossless-auto")):  # fmt: skip
        out = generate_json(capsys, *args, *common)
        assert out["token_ids"] == ar["token_ids"], args
        assert out["stats"]["nfe_verify"] >= 1


@pytest.mark.parametrize("preset", ["paper-sdar-a", "paper-sdar-b"])
def test_sdar_presets_run(capsys, preset):
    obj = generate_json(capsys, "--preset", preset, "--max-new-tokens", "24", "--set", "ignore_eos=true")
    s = obj["stats"]
    assert s["generated_tokens"] == 24
    assert s["nfe"] == s["nfe_prefill"] + s["nfe_draft"] + s["nfe_verify"] + s["nfe_commit"]


def test_a_broken_checkpoint_is_a_one_line_error(capsys, tmp_path):
    bad_k = make_random_sdar_moe(tmp_path / "topk")
    cfg = json.loads((bad_k / "config.json").read_text())
    cfg["num_experts_per_tok"] = 9
    (bad_k / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli(capsys, "generate", PROMPT, "--model", str(bad_k), "--ids")
    assert_one_line_error(code, err, "not a valid SDAR-MoE config", "num_experts_per_tok")

    missing = make_random_sdar_moe(tmp_path / "missing")
    weights = load_file(str(missing / "model.safetensors"))
    del weights["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(weights, str(missing / "model.safetensors"))
    code, _, err = run_cli(capsys, "generate", PROMPT, "--model", str(missing), "--ids")
    assert_one_line_error(code, err, "model.layers.1.mlp.experts", "experts 0..3")

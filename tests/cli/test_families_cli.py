"""``s2d2 generate`` end to end on every family's fixture directory (random weights: shapes, stopping and
statistics, not text), plus the paper's presets for each family."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, STAT_KEYS, run_cli

FAMILY_DIRS = {"sdar": "sdar", "fast_dllm_v2": "fast_dllm_v2", "llada2": "llada2"}
PROMPT = "17 42 101 7 250 3 88 199 5"


def generate_json(capsys, family, *args):
    code, out, err = run_cli(
        capsys, "generate", PROMPT, "--model", str(FIXTURES / FAMILY_DIRS[family]), "--ids", "--json", *args
    )
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module", autouse=True)
def _need_fixtures():
    if not all((FIXTURES / d).is_dir() for d in FAMILY_DIRS.values()):
        pytest.skip("conformance fixtures not available")


@pytest.mark.parametrize("family", list(FAMILY_DIRS))
@pytest.mark.parametrize(
    "decoder_args",
    [
        ["--decoder", "ar"],
        ["--decoder", "dynamic", "--block-size", "4"],
        ["--decoder", "s2d2", "--block-size", "4", "--policy", "always"],
    ],
)
def test_generate_on_fixture(capsys, family, decoder_args):
    obj = generate_json(capsys, family, "--max-new-tokens", "10", "--set", "ignore_eos=true", *decoder_args)
    s = obj["stats"]
    assert set(s) >= STAT_KEYS
    assert len(obj["token_ids"]) == s["generated_tokens"] == 10
    assert all(0 <= t < 512 for t in obj["token_ids"])
    assert s["nfe"] == s["nfe_prefill"] + s["nfe_draft"] + s["nfe_verify"] + s["nfe_commit"]
    assert s["accepted"] <= s["drafted"]
    if decoder_args[1] == "ar":
        assert s["nfe_draft"] == 10 and s["nfe_verify"] == 0
    if decoder_args[1] == "s2d2":
        assert s["verify_steps"] == s["nfe_verify"] >= 1


@pytest.mark.parametrize("family", list(FAMILY_DIRS))
def test_stop_token_on_fixture(capsys, family):
    free = generate_json(
        capsys, family, "--max-new-tokens", "12", "--set", "ignore_eos=true", "--decoder", "ar"
    )
    stop = free["token_ids"][4]
    first = free["token_ids"].index(stop)
    obj = generate_json(
        capsys,
        family,
        "--max-new-tokens",
        "12",
        "--set",
        "ignore_eos=true",
        "--decoder",
        "ar",
        "--set",
        f"stop_token_ids=[{stop}]",
    )
    assert obj["token_ids"] == free["token_ids"][: first + 1]
    assert obj["stats"]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("family", "preset"),
    [
        ("sdar", "paper-sdar-a"),
        ("sdar", "paper-sdar-b"),
        ("fast_dllm_v2", "paper-fast-dllm-v2-sub4"),
        ("fast_dllm_v2", "paper-fast-dllm-v2-sub32"),
        ("llada2", "paper-llada2-conservative"),
        ("llada2", "paper-llada2-quality"),
    ],
)
def test_paper_presets_run(capsys, family, preset):
    obj = generate_json(
        capsys, family, "--preset", preset, "--max-new-tokens", "40", "--set", "ignore_eos=true"
    )
    assert obj["stats"]["generated_tokens"] == 40


def test_lossless_on_shifted_family(capsys):
    """Fast-dLLM v2 (shifted predictions): the lossless preset equals AR too."""
    ar = generate_json(
        capsys, "fast_dllm_v2", "--decoder", "ar", "--max-new-tokens", "16", "--set", "ignore_eos=true"
    )
    for b in ("2", "4", "8"):
        s2 = generate_json(
            capsys,
            "fast_dllm_v2",
            "--preset",
            "lossless",
            "--block-size",
            b,
            "--max-new-tokens",
            "16",
            "--set",
            "ignore_eos=true",
        )
        assert s2["token_ids"] == ar["token_ids"], b

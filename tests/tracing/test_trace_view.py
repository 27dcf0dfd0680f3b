"""The decode trace's terminal view, on a recorded trace (its text, colours aside), and ``s2d2 trace``."""

from __future__ import annotations

import pytest

from conftest import run_cli, tiny_model_path
from s2d2.decoding.stats import GenerationStats, StepTrace
from s2d2.tracing import build_view, commit_counts
from s2d2.tracing.render_terminal import render_text

#: A recorded trace: prompt of 6 tokens, block size 4 (block 0 holds prompt positions 4-5).
PROMPT = [10, 11, 12, 13, 14, 15]
TRACE = [
    StepTrace(4, 0, [(6, 20, "accepted"), (7, 21, "resampled")], True, 2, 1, [(0.9, 0.8), (0.4, 0.7)]),
    StepTrace(8, 0, [(8, 22, "fallback"), (9, 23, "fallback")], False, 0, 0),
    StepTrace(8, 1, [(10, 24, "accepted"), (11, 1, "accepted")], True, 2, 2),
]
STATS = GenerationStats(nfe_prefill=1, nfe_draft=3, nfe_verify=2, generated_tokens=6, finish_reason="stop")


def _view():
    return build_view(TRACE, PROMPT, 4, lambda i: f"t{i}", stats=STATS, prompt_text="p", output_text="o")


def test_view_lays_out_blocks_steps_and_running_nfe():
    view = _view()
    assert [(s.block_index, s.step, s.kind, s.nfe) for s in view.steps] == [
        (0, 0, "draft + verify", 3), (1, 0, "draft", 4), (1, 1, "draft + verify", 6),
    ]  # fmt: skip
    assert view.steps[-1].nfe == STATS.nfe
    first = view.steps[0].cells
    assert [(c.kind, c.new) for c in first] == [("prompt", False)] * 2 + [
        ("accepted", True),
        ("resampled", True),
    ]
    assert (first[2].confidence, first[2].q_prob) == (0.9, 0.8)
    second = view.steps[1].cells
    assert [c.kind for c in second] == ["fallback", "fallback", "mask", "mask"]
    assert [c.kind for c in view.steps[2].cells][2:] == ["accepted", "accepted"]
    assert [c.new for c in view.steps[2].cells] == [False, False, True, True]
    assert view.counts == commit_counts(TRACE) == {"accepted": 3, "resampled": 1, "fallback": 2}


def test_terminal_view_text():
    text = render_text(_view())
    lines = text.splitlines()
    assert "prompt: p" in lines[0]
    assert "block 0 (positions from 4)" in text and "block 1 (positions from 8)" in text
    step_lines = [line for line in lines if line.lstrip().startswith("step ")]
    assert len(step_lines) == 3
    assert "draft + verify" in step_lines[0] and "NFE 3" in step_lines[0]
    assert step_lines[0].split("|", 1)[1].split()[:4] == ["t14", "t15", "t20", "t21"]
    assert "(verified 2, accepted 1)" in step_lines[0]
    assert step_lines[1].split("|", 1)[1].split() == ["t22", "t23", "·", "·"]
    assert "NFE 4" in step_lines[1] and "verify" not in step_lines[1]
    assert "output: o" in text
    for row in ("commits: accepted", "commits: fallback", "commits: resampled", "nfe per token"):
        assert row in text


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_trace_cli_prints_every_step(capsys, tmp_path):
    out = tmp_path / "t.html"
    code, stdout, err = run_cli(
        capsys, "trace", "Tom has 3 apples and buys 5 more.", "--block-size", "8", "--policy", "score",
        "--max-new-tokens", "16", "--html", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert "block 0" in stdout and "summary" in stdout and "NFE" in stdout
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "step-slider" in page
    for external in ("http://", "https://", "<link", "src="):
        assert external not in page

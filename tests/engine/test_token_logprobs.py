"""Committed tokens' log-probabilities from the engine: for the lossless family every token was
verified by the AR mode, so each value equals the exact AR-mode score of that token; tokens committed
without verification carry the drafter's value, marked as such."""

from __future__ import annotations

import pytest

from conftest import SDAR_FIXTURE
from s2d2 import load
from s2d2.engine.logprobs import LogprobSource
from s2d2.tasks.tiny_gsm.splits import load_split


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-gsm")


def _check_against_score(model, prompt, out, top):
    scores = model.score([(prompt, out.token_ids)], top_logprobs=top)[0]
    assert len(out.logprobs) == len(out.token_ids)
    for lp, want, tok in zip(out.logprobs, scores.logprobs, out.token_ids, strict=True):
        assert lp.token_id == tok and lp.source == LogprobSource.AR
        assert lp.logprob == pytest.approx(want, abs=1e-4)
    if top:
        for lp, alts in zip(out.logprobs, scores.top, strict=True):
            assert [t for t, _ in lp.top] == [t for t, _ in alts]
            assert [v for _, v in lp.top] == pytest.approx([v for _, v in alts], abs=1e-4)


@pytest.mark.parametrize(
    "settings",
    [dict(preset="lossless", block_size=8), dict(preset="lossless-fused", block_size=8), dict(decoder="ar")],
    ids=["lossless", "fused", "ar"],
)
def test_lossless_logprobs_equal_the_ar_score(tiny, settings):
    for problem in load_split("test")[:4]:
        prompt = tiny.encode(problem["question"])
        out = tiny.generate(prompt, logprobs=3, max_new_tokens=40, **settings)
        _check_against_score(tiny, prompt, out, 3)


def test_logprobs_batched_equal_alone(tiny):
    prompts = [tiny.encode(p["question"]) for p in load_split("test")[:6]]
    batch = tiny.generate_batch(prompts, preset="lossless", block_size=8, logprobs=0, max_new_tokens=32)
    for prompt, got in zip(prompts, batch, strict=True):
        alone = tiny.generate(prompt, preset="lossless", block_size=8, logprobs=0, max_new_tokens=32)
        assert got.token_ids == alone.token_ids
        # the packed forward's logits may differ from the lone row's in the last bits
        want = [lp.logprob for lp in alone.logprobs]
        assert [lp.logprob for lp in got.logprobs] == pytest.approx(want, abs=1e-5)


def test_unverified_tokens_are_marked_draft(tiny):
    prompt = tiny.encode(load_split("test")[0]["question"])
    out = tiny.generate(prompt, decoder="dynamic", block_size=8, threshold=0.5, logprobs=0, max_new_tokens=24)
    assert {lp.source for lp in out.logprobs} == {LogprobSource.DRAFT}
    assert all(lp.logprob <= 0 for lp in out.logprobs)
    assert tiny.generate(prompt, max_new_tokens=8).logprobs is None  # only when asked for


def test_sdar_fixture_lossless_logprobs_equal_score():
    if not SDAR_FIXTURE.is_dir():
        pytest.skip(f"conformance fixtures not found at {SDAR_FIXTURE}")
    model = load(str(SDAR_FIXTURE))
    prompt = [17, 42, 101, 7, 250, 3, 88, 199]
    out = model.generate(
        prompt, preset="lossless", block_size=4, logprobs=2, max_new_tokens=12, ignore_eos=True
    )
    _check_against_score(model, prompt, out, 2)

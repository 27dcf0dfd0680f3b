"""Fused verification (``lossless-fused``): one forward per step and still AR greedy's output.

The verification forward carries the next step's draft queries for its likely outcomes; the next step
takes the group of the outcome that happened. The lossless property must survive every outcome, hit or
miss, on the built-in model and on the same-position fixtures, alone and in batches that mix block
sizes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s2d2
from conftest import examples, load_or_skip
from s2d2.engine.llm_engine import LLMEngine

BLOCK_SIZES = (2, 4, 8, 16)


@pytest.fixture(scope="module", params=["tiny-gsm", "sdar", "llada2"])
def model(request):
    return load_or_skip(request.param)


def _check(model, prompt: list[int], max_new: int) -> None:
    common = dict(max_new_tokens=max_new, ignore_eos=True)
    engine = LLMEngine(model.adapter, max_num_seqs=len(BLOCK_SIZES))
    # AR with a truly causal prefill (LLaDA2's official prefill is unmasked unless the cache is causal)
    ar = engine.generate([prompt], [model.make_config(decoder="ar", causal_cache=True, **common)])[0]
    cfgs = [model.make_config(preset="lossless-fused", block_size=b, **common) for b in BLOCK_SIZES]
    for b, out in zip(BLOCK_SIZES, engine.generate([prompt] * len(cfgs), cfgs), strict=True):
        assert out.token_ids == ar.token_ids, f"B={b}: {out.token_ids} != AR {ar.token_ids}"
        s = out.stats
        assert s.fallback_commits == 0 and s.nfe == s.nfe_prefill + s.nfe_draft + s.nfe_verify
        assert s.nfe_draft + s.predraft_hits == s.steps  # every step drafted afresh or took a pre-draft


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_fused_equals_ar(model, data):
    info = model.info
    token = st.integers(0, info.vocab_size - 1).filter(lambda t: t != info.mask_token_id)
    prompt = data.draw(st.lists(token, min_size=1, max_size=20), label="prompt")
    max_new = data.draw(st.integers(1, 24), label="max_new_tokens")
    _check(model, prompt, max_new)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_fused_equals_ar_on_sdar_moe(sdar_moe_model, data):
    """The same on the SDAR-MoE checkpoint (routed experts), with fewer examples."""
    model = sdar_moe_model
    token = st.integers(0, model.info.vocab_size - 1).filter(lambda t: t != model.info.mask_token_id)
    prompt = data.draw(st.lists(token, min_size=1, max_size=20), label="prompt")
    _check(model, prompt, data.draw(st.integers(1, 24), label="max_new_tokens"))


def test_fused_saves_forwards_on_the_built_in_model():
    tiny = load_or_skip("tiny-gsm")
    from s2d2.bench.suites import load_problems

    qs = [p["question"] for p in load_problems("tiny-gsm", "test", 24)]
    kw = dict(block_size=16, max_new_tokens=64)
    ar = tiny.generate_batch(qs, decoder="ar", max_new_tokens=64)
    plain = tiny.generate_batch(qs, preset="lossless", **kw)
    fused = tiny.generate_batch(qs, preset="lossless-fused", **kw)
    alone = [tiny.generate(q, preset="lossless-fused", **kw) for q in qs[:4]]
    assert [o.token_ids for o in fused] == [o.token_ids for o in ar] == [o.token_ids for o in plain]
    assert [o.token_ids for o in alone] == [o.token_ids for o in fused[:4]]
    assert [o.stats.nfe for o in alone] == [o.stats.nfe for o in fused[:4]]
    total = {k: sum(getattr(o.stats, k) for o in fused) for k in ("nfe", "predraft_hits", "predraft_misses")}
    assert total["nfe"] < 0.8 * sum(o.stats.nfe for o in plain)
    assert total["predraft_hits"] > 2 * total["predraft_misses"]
    assert all(o.stats.query_tokens > o.stats.nfe for o in fused)


def test_fuse_needs_the_lossless_family_and_same_position_models():
    tiny = load_or_skip("tiny-gsm")
    with pytest.raises(s2d2.ConfigError, match="fuse needs.*policy='always'"):
        tiny.make_config(preset="lossless-fused", policy="score", fuse=True)
    with pytest.raises(s2d2.ConfigError, match="causal_cache"):
        tiny.make_config(preset="lossless", causal_cache=False, fuse=True)
    # a named preset's fusion is asked for: settings that exclude it are refused (s2d2.applicability);
    # the model's shipped defaults give way to them
    with pytest.raises(s2d2.ConfigError, match="from the preset 'lossless-fused'.*policy='always'"):
        tiny.make_config(preset="lossless-fused", policy="score")
    assert not tiny.make_config(decoder="ar").fuse and tiny.make_config().fuse == tiny.default_config().fuse
    with pytest.raises(s2d2.ConfigError, match="predraft_positions"):
        tiny.make_config(preset="lossless-fused", predraft_positions=-1)
    shifted = load_or_skip("fast_dllm_v2")
    with pytest.raises(s2d2.ConfigError, match="shifted"):
        shifted.generate([5, 6, 7], preset="lossless-fused", max_new_tokens=4)


def test_fused_trace_marks_pre_drafted_steps_and_counts_forwards():
    from s2d2.tracing.view import build_view

    tiny = load_or_skip("tiny-gsm")
    q = "Priya starts with 111 shells. She gives 4 kids 11 shells each. How many shells does Priya have now?"
    out = tiny.generate(q, preset="lossless-fused", block_size=8, trace=True)
    kinds = {how for st in out.trace for _, _, how in st.commits}
    assert "predraft" in kinds and kinds <= {"accepted", "predraft", "resampled"}
    assert sum(st.predrafted for st in out.trace) == out.stats.predraft_hits
    probs = [p for st in out.trace for p in st.probs]
    assert probs and all(c is not None and 0 < c <= 1 and 0 < qp <= 1 for c, qp in probs)
    view = build_view(out.trace, tiny.encode(q), 8, str, stats=out.stats)
    assert view.steps[-1].nfe == out.stats.nfe

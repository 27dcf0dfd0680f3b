"""OpenAI's logit adjustments in the engine: the drafter and the verifier apply them alike, so the
lossless family still gives AR's exact output under the same adjustments, alone and batched."""

from __future__ import annotations

import pytest

from s2d2 import load
from s2d2.engine.llm_engine import LLMEngine
from s2d2.tasks.tiny_gsm.splits import load_split

ADJUSTMENTS = [
    dict(presence_penalty=0.8, frequency_penalty=0.4),
    dict(logit_bias={12: 3.0, 9: -2.0}),
    dict(min_tokens=40),
]


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-gsm")


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(p["question"]) for p in load_split("test")[:10]]


@pytest.mark.parametrize("adjust", ADJUSTMENTS, ids=["penalties", "bias", "min_tokens"])
def test_lossless_equals_ar_under_the_same_adjustments(tiny, prompts, adjust):
    engine = LLMEngine(tiny.adapter, max_num_seqs=4)
    n = len(prompts)
    ar = engine.generate(prompts, [tiny.make_config(decoder="ar", max_new_tokens=48, **adjust)] * n)
    plain = engine.generate(prompts, [tiny.make_config(decoder="ar", max_new_tokens=48)] * n)
    assert any(a.token_ids != b.token_ids for a, b in zip(ar, plain, strict=True))  # it has an effect
    for preset in ("lossless", "lossless-fused"):
        cfg = tiny.make_config(preset=preset, block_size=8, max_new_tokens=48, **adjust)
        batched = engine.generate(prompts, [cfg] * n)
        assert [o.token_ids for o in batched] == [o.token_ids for o in ar], preset
        alone = LLMEngine(tiny.adapter, max_num_seqs=1).generate(prompts[:3], [cfg] * 3)
        assert [o.token_ids for o in alone] == [o.token_ids for o in ar[:3]]


def test_min_tokens_holds_back_the_stop_token(tiny, prompts):
    eos = set(tiny.info.eos_token_ids)
    cfg = tiny.make_config(preset="lossless", block_size=8, max_new_tokens=48, min_tokens=30)
    for out in LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * len(prompts)):
        assert not eos & set(out.token_ids[:30])
        assert len(out.token_ids) >= 30


def test_logit_bias_can_force_a_token(tiny, prompts):
    cfg = tiny.make_config(decoder="dynamic", block_size=8, max_new_tokens=8, logit_bias={7: 100.0})
    out = LLMEngine(tiny.adapter).generate(prompts[:2], [cfg] * 2)
    assert all(o.token_ids == [7] * 8 for o in out)

"""Engine-wide bounds on what one request may make a shared forward carry (max_query_tokens_per_row)."""

from __future__ import annotations

import pytest

import s2d2
from s2d2.config import PRESETS, DecodeConfig
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.request_limits import (
    MAX_PREDRAFT_GROUPS,
    TUNED_WORST,
    RequestLimitError,
    check_request_limits,
    default_max_query_tokens_per_row,
    fold_limit_for,
    predraft_groups,
    row_query_tokens,
)
from s2d2.errors import ConfigError
from s2d2.tuning.space import BLOCK_SIZES

#: the settings of the issue's 72-second request, and of its 21-second one
SLOW_72S = {"preset": "lossless-fused", "block_size": 32, "predraft_positions": 32, "predraft_tokens": 64}
SLOW_21S = {"block_size": 16, "predraft_tokens": 319}  # the model's fused preset at B16


class Recording:
    """An adapter that records the largest segment (query tokens of one row) of every forward."""

    def __init__(self, adapter):
        self.inner = adapter
        self.largest = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, segments):
        self.largest = max([self.largest] + [s.n for s in segments])
        return self.inner.run(segments)


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=4)


def test_default_fits_every_shipped_preset_and_refuses_the_slow_requests(model):
    engine = LLMEngine(model.adapter, max_num_seqs=2)
    limit = engine.max_query_tokens_per_row
    assert limit == default_max_query_tokens_per_row(model.info.default_block_size) == 160
    assert model.max_query_tokens_per_row == 160 == model.engine.max_query_tokens_per_row
    # the largest settings s2d2 tune searches fit (its blocks and fused ranges: tuning/space.py)
    assert max(BLOCK_SIZES) == TUNED_WORST["block_size"]
    prompt = model.encode("Tom has 3 apples.")
    engine.add_request(prompt, model.make_config(**TUNED_WORST, max_new_tokens=4))
    for name in PRESETS:
        engine.add_request(prompt, model.make_config(preset=name, max_new_tokens=4))
    engine.add_request(prompt, model.make_config(max_new_tokens=4))  # the model's own (tuned) preset
    with pytest.raises(RequestLimitError) as slow:
        engine.add_request(prompt, model.make_config(**SLOW_72S))
    assert slow.value.setting == "predraft_positions" and "max_query_tokens_per_row of 160" in str(slow.value)
    assert "33824 query tokens" in str(slow.value) and "\n" not in str(slow.value)
    with pytest.raises(RequestLimitError) as slow:
        engine.add_request(prompt, model.make_config(**SLOW_21S))
    assert slow.value.setting == "predraft_tokens" and "18550 query tokens" in str(slow.value)
    with pytest.raises(RequestLimitError) as big:
        engine.add_request(prompt, model.make_config(preset="lossless", block_size=256))
    assert big.value.setting == "block_size"
    assert engine.num_waiting == len(PRESETS) + 2  # the refused ones never queued


def test_a_configured_bound_through_load():
    small = s2d2.load("tiny-gsm", max_num_seqs=1, max_query_tokens_per_row=32)
    assert small.engine.max_query_tokens_per_row == 32
    with pytest.raises(RequestLimitError) as err:
        small.generate("Tom has 3 apples.", preset="lossless", block_size=32, max_new_tokens=4)
    assert err.value.setting == "block_size"
    settings = {"preset": "lossless", "block_size": 16, "max_new_tokens": 4, "ignore_eos": True}
    out = small.generate("Tom has 3 apples.", **settings)
    assert out.stats.generated_tokens == 4
    with pytest.raises(ConfigError, match="max_query_tokens_per_row must be >= 1"):
        s2d2.load("tiny-gsm", max_query_tokens_per_row=0)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"preset": "lossless", "block_size": 8},
        {"preset": "lossless-fused", "block_size": 8, "predraft_positions": 3, "predraft_tokens": 2},
        {"preset": "paper-sdar-a"},
        {"decoder": "dynamic", "block_size": 16, "fuse": False},
    ],
)
def test_the_worst_case_bounds_every_forward_and_long_prompts_are_chunked(model, settings):
    """Each row's segment in every forward stays within the computed worst case and within the bound;
    a prompt longer than the bound is prefilled in chunks that fit, with the same tokens as unbounded."""
    prompt = model.encode(" ".join(["Tom has 3 apples and buys 4 more."] * 34))[:300]
    assert len(prompt) == 300
    cfg = model.make_config(max_new_tokens=24, ignore_eos=True, **settings)
    outs = []
    for limit in (4096, 128):
        rec = Recording(model.adapter)
        engine = LLMEngine(rec, max_num_seqs=1, max_query_tokens_per_row=limit)
        chunk = engine.runner.prefill_chunk
        fold = fold_limit_for(limit, cfg, chunk)
        worst = row_query_tokens(cfg, prefill_chunk=chunk, fold_limit=fold, vocab_size=model.info.vocab_size)
        worst = worst.worst
        outs.append(engine.generate([prompt], [cfg])[0])
        assert outs[-1].status == "finished"
        assert rec.largest <= min(worst, limit)
    assert outs[0].token_ids == outs[1].token_ids


@pytest.mark.parametrize(
    ("settings", "setting"),
    [
        ({"predraft_positions": 9, "predraft_tokens": 1}, "predraft_positions"),  # 10 groups
        ({"predraft_positions": 4, "predraft_tokens": 2}, "predraft_tokens"),  # 9 groups, 5 with one token
    ],
)
def test_pre_draft_groups_are_bounded_too(settings, setting):
    cfg = DecodeConfig.build(preset="lossless-fused", block_size=16, **settings)
    assert row_query_tokens(cfg, prefill_chunk=256, fold_limit=240, vocab_size=320).worst <= 256
    with pytest.raises(RequestLimitError) as err:
        check_request_limits(cfg, limit=256, prefill_chunk=256, fold_limit=240, vocab_size=320)
    assert err.value.setting == setting and f"limit of {MAX_PREDRAFT_GROUPS}" in str(err.value)
    fits = DecodeConfig.build(preset="lossless-fused", block_size=16, predraft_positions=7, predraft_tokens=1)
    assert predraft_groups(fits, 320) == MAX_PREDRAFT_GROUPS == 8
    check_request_limits(fits, limit=256, prefill_chunk=256, fold_limit=240, vocab_size=320)


def test_check_is_pure_and_names_the_setting():
    cfg = DecodeConfig.build(**SLOW_72S)
    need = row_query_tokens(cfg, prefill_chunk=256, fold_limit=224, vocab_size=320)
    assert (need.prefill, need.draft, need.verify, need.kind()) == (256, 256, 33824, "verification")
    # with predraft_positions 0 the fused verification is 2B + B (the next block's group): it fits 96
    fits = DecodeConfig.build(**{**SLOW_72S, "predraft_positions": 0})
    need = row_query_tokens(fits, prefill_chunk=64, fold_limit=32, vocab_size=320)
    assert need.verify == 96 == need.worst
    assert check_request_limits(fits, limit=96, prefill_chunk=64, fold_limit=32, vocab_size=320) == need
    with pytest.raises(RequestLimitError):
        check_request_limits(fits, limit=95, prefill_chunk=64, fold_limit=32, vocab_size=320)

"""The block size chosen by load (``plan_block_sizes``): the rule on both kinds of profile, the settings
that leave it open, and in the engine: the size chosen, the tokens AR greedy's whichever it is."""

from __future__ import annotations

import pytest

import s2d2
from conftest import REPO
from s2d2.bench.suites import load_problems
from s2d2.config import DecodeConfig
from s2d2.cost.generic import GENERIC_COST
from s2d2.cost.step_cost import roofline
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.planner.block_size import choose_block_size, forward_ms
from s2d2.errors import ConfigError

SDAR_8B = REPO / "scripts" / "shapes" / "sdar-8b.json"


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


@pytest.fixture(scope="module")
def h200():
    return roofline("roofline:h200", SDAR_8B)


def test_a_memory_bound_forward_takes_the_bigger_block(h200):
    # one row of an 8B model on an H200: a forward reads the weights whatever it feeds
    assert forward_ms(h200, 1, 33, 200) == pytest.approx(forward_ms(h200, 1, 17, 200), rel=0.01)
    assert choose_block_size(h200, [8, 16], rows=1, context=200) == 16
    assert choose_block_size(h200, [16, 8, 4], rows=2, context=200) == 16


def test_past_the_ridge_or_on_a_cpu_the_smaller_block_stays(h200):
    # 8 rows: a whole-block verification of 16 (8 x 33 query tokens) is past the ridge
    assert forward_ms(h200, 8, 33, 200) > 1.5 * forward_ms(h200, 8, 17, 200)
    assert choose_block_size(h200, [8, 16], rows=8, context=200) == 8
    assert choose_block_size(h200, [8, 16], rows=64, context=200) == 8
    assert choose_block_size(GENERIC_COST, [8, 16], rows=1, context=200) == 8
    with pytest.raises(ValueError):
        choose_block_size(GENERIC_COST, [], rows=1, context=0)


def test_which_settings_leave_the_block_size_open():
    auto = DecodeConfig.build(preset="lossless-auto", block_size=8)
    assert auto.block_size_choices() == (4, 8, 16)
    assert DecodeConfig.build(preset="lossless-auto", block_size=4).block_size_choices() == (4, 8, 16)
    assert DecodeConfig.build(preset="lossless-auto", plan_block_sizes=()).block_size_choices() == ()
    assert DecodeConfig.build(preset="lossless-auto", plan="fixed").block_size_choices() == ()
    # outside the lossless family the tokens would depend on the block: only block_size
    assert DecodeConfig.build(preset="lossless-auto", fuse=False, policy="score").block_size_choices() == ()
    assert DecodeConfig.build(preset="lossless-auto", steps=8, block_size=8).block_size_choices() == ()
    # from JSON (a preset file, a request) a list
    assert DecodeConfig.build(plan="auto", plan_block_sizes=[16, 8]).plan_block_sizes == (16, 8)


@pytest.mark.parametrize("bad", [[0], [8, "16"], [True], "16", 16])
def test_bad_plan_block_sizes_are_one_line_errors(bad):
    with pytest.raises(ConfigError, match="plan_block_sizes must be a list of integers >= 1") as err:
        DecodeConfig.build(plan_block_sizes=bad)
    assert "\n" not in str(err.value)


def _decode(tiny, rows: int, cfg: DecodeConfig, n: int, **engine):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", n)]
    eng = LLMEngine(tiny.adapter, max_num_seqs=rows, **engine)
    return eng.generate(prompts, [cfg] * n), eng.stats()


def test_the_engine_chooses_by_load_and_keeps_ar_greedy_tokens(tiny, h200):
    cfg = tiny.make_config(tiny.checkpoint_config(), preset="lossless-auto", block_size=8, max_new_tokens=40)
    ar = tiny.make_config(tiny.checkpoint_config(), decoder="ar", max_new_tokens=40)
    ref, _ = _decode(tiny, 4, ar, 6)
    alone, s1 = _decode(tiny, 1, cfg, 6, cost=h200)
    batch, s8 = _decode(tiny, 8, cfg, 6, cost=h200)
    cpu, sc = _decode(tiny, 1, cfg, 6)
    assert (s1["plan_block_choices"], s1["plan_mean_block_size"]) == (6, 16)
    # generate's batch, 6 rows: still B16 (the cycle model), decoded fixed (fusion no longer pays)
    assert s8["plan_admissions"] == {"fixed-16": 6} and s1["plan_admissions"] == {"planned-16": 6}
    assert sc["plan_mean_block_size"] == 8
    for outs in (alone, batch, cpu):
        assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert sum(o.stats.nfe for o in alone) < sum(o.stats.nfe for o in cpu)


def test_a_block_size_over_the_engines_bound_per_row_is_not_chosen(tiny, h200):
    cfg = tiny.make_config(tiny.checkpoint_config(), preset="lossless-auto", block_size=8, max_new_tokens=24)
    eng = LLMEngine(tiny.adapter, max_num_seqs=1, cost=h200, max_query_tokens_per_row=64)
    with pytest.raises(ConfigError):
        eng.check_limits(cfg.replace(block_size=16))
    eng.check_limits(cfg)
    eng.generate([tiny.encode("1+1=")], [cfg])
    assert eng.stats()["plan_mean_block_size"] == 8

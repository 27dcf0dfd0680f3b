"""Whether a ``plan="auto"`` request is planned step by step, chosen by load when it is added
(engine/plan_regime.py): the rule on both kinds of profile, the fixed settings it decodes with, and in
the engine: which requests are planned, and the tokens AR greedy's either way."""

from __future__ import annotations

import pytest

import s2d2
from conftest import REPO
from s2d2.bench.suites import load_problems
from s2d2.config import DecodeConfig
from s2d2.cost.generic import GENERIC_COST
from s2d2.cost.step_cost import FittedCost, roofline
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.planner.block_size import forward_ms
from s2d2.engine.planner.regime import MIN_FIXED_SHARE, fixed_config, fixed_share, plans_step_by_step

SDAR_8B = REPO / "scripts" / "shapes" / "sdar-8b.json"


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 16)]


def test_the_fixed_share_of_a_draft_forward():
    cost = FittedCost((1.0, 0.0, 0.1, 0.0))  # 1 ms a forward, 0.1 ms a query token
    assert fixed_share(cost, 1, 8, 100) == pytest.approx(1.0 / 1.9)
    assert fixed_share(cost, 4, 8, 100) == pytest.approx(1.0 / (1.0 + 3.6))
    assert forward_ms(cost, 4, 0, 100) == pytest.approx(1.0)
    assert plans_step_by_step(cost, 1, 8, 100, min_share=0.5) and not plans_step_by_step(cost, 1, 8, 100)
    assert plans_step_by_step(cost, 4, 8, 100, min_share=0.0)
    assert plans_step_by_step(FittedCost((0.0, 0.0, 0.0, 0.0)), 64, 8, 0)  # a free forward: all fixed


def test_on_the_cpu_profile_planning_stops_past_one_row():
    assert [plans_step_by_step(GENERIC_COST, r, 8, 150) for r in (1, 2, 4, 8, 16, 64)] == [
        True, False, False, False, False, False,
    ]  # fmt: skip
    # a bigger block is more of a forward's tokens: it stops planning sooner
    share = fixed_share(GENERIC_COST, 2, 8, 150)
    assert fixed_share(GENERIC_COST, 2, 16, 150) < share < MIN_FIXED_SHARE


def test_a_projection_plans_where_fusion_pays_and_decodes_ar_where_compute_bound(tiny):
    h200 = roofline("roofline:h200", SDAR_8B)
    engine = LLMEngine(tiny.adapter, max_num_seqs=256, cost=h200)
    cfg = DecodeConfig.build(preset="lossless-auto", block_size=8, max_new_tokens=64)
    decide = engine.planner.regime.decide
    assert (decide(cfg, (4, 8, 16), 40, 1).mode, decide(cfg, (4, 8, 16), 40, 1).block_size) == ("planned", 16)
    assert (decide(cfg, (4, 8, 16), 40, 8).mode, decide(cfg, (4, 8, 16), 40, 8).block_size) == ("fixed", 16)
    assert (decide(cfg, (4, 8, 16), 40, 32).mode, decide(cfg, (4, 8, 16), 40, 32).block_size) == ("fixed", 4)
    assert decide(cfg, (4, 8, 16), 40, 128).mode == decide(cfg, (4, 8, 16), 40, 256).mode == "ar"
    # sampled settings never go to AR (it would draw other tokens)
    sampled = DecodeConfig.build(preset="lossless-auto", block_size=8, temperature=0.7, max_new_tokens=64)
    assert decide(sampled, (4, 8, 16), 40, 256).mode == "fixed"
    # a measured profile (host time counts): planned at one row only, unless the tests force the plans
    measured = LLMEngine(tiny.adapter, max_num_seqs=64)
    assert measured.planner.regime.decide(cfg, (8,), 100, 1).mode == "planned"
    assert measured.planner.regime.decide(cfg, (8,), 100, 16).mode == "fixed"
    # at 64 rows this CPU's AR steps (less host time a row) are priced ahead of plain B8, as measured
    assert measured.planner.regime.decide(cfg, (8,), 100, 64).mode == "ar"


def test_the_fixed_settings_are_the_plain_lossless_configuration():
    auto = DecodeConfig.build(preset="lossless-auto", max_new_tokens=48)
    fixed = fixed_config(auto)
    assert (fixed.plan, fixed.fuse, fixed.plan_block_sizes) == ("fixed", False, ())
    plain = DecodeConfig.build(preset="lossless", block_size=auto.block_size, max_new_tokens=48)
    for name in ("decoder", "policy", "acceptance", "causal_cache", "block_size", "temperature", "steps"):
        assert getattr(fixed, name) == getattr(plain, name), name


def _ar(tiny, prompts):
    cfg = tiny.make_config(decoder="ar", max_new_tokens=40)
    engine = LLMEngine(tiny.adapter, max_num_seqs=16)
    return [o.token_ids for o in engine.generate(prompts, [cfg] * len(prompts))]


def test_a_loaded_batch_decodes_fixed_a_light_one_planned_same_tokens(tiny, prompts):
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=40)
    ar = _ar(tiny, prompts)
    loaded = LLMEngine(tiny.adapter, max_num_seqs=16)
    assert [o.token_ids for o in loaded.generate(prompts, [cfg] * 16)] == ar
    stats = loaded.stats()
    assert stats["plan_fixed_choices"] == 16 and stats["plan_rows"] == 0  # no step was planned
    assert stats["plan_block_choices"] == 16 and stats["plan_mean_block_size"] == 4  # B4 at 16 rows
    light = LLMEngine(tiny.adapter, max_num_seqs=1)
    assert [o.token_ids for o in light.generate(prompts[:1], [cfg])] == ar[:1]
    assert light.stats()["plan_fixed_choices"] == 0 and light.stats()["plan_rows"] > 0


def test_requests_added_one_by_one_count_the_load_they_join(tiny, prompts):
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=40)
    engine = LLMEngine(tiny.adapter, max_num_seqs=16)
    for p in prompts:
        engine.add_request(p, cfg)  # as a server adds them: the running and waiting ones, and itself
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.output.token_ids
    # the first (a light load) is planned step by step, the rest decode fixed
    assert engine.stats()["plan_admissions"] == {"planned-8": 1, "fixed-8": 15}
    assert engine.stats()["plan_fixed_choices"] == 15
    assert [outs[i] for i in sorted(outs)] == _ar(tiny, prompts)


def test_outside_the_lossless_family_nothing_is_chosen(tiny, prompts):
    cfg = tiny.make_config(preset="lossless-auto", policy="score", fuse=False, max_new_tokens=24)
    engine = LLMEngine(tiny.adapter, max_num_seqs=16)
    engine.generate(prompts, [cfg] * 16)
    assert engine.stats()["plan_fixed_choices"] == 0


def test_bench_rows_and_metrics_count_the_fixed_requests(tiny):
    from s2d2.bench.throughput import run_throughput
    from s2d2.serving.metrics import ServerMetrics

    out = run_throughput(tiny, n=16, limits=(1, 16), configs=("lossless-auto",), max_new_tokens=16)
    one, loaded = out["rows"]
    assert "plan_fixed_choices" not in one and one["plan_ms_per_step"] > 0  # one row: planned
    assert loaded["plan_fixed_choices"] == 16 and "plan_ms_per_step" not in loaded  # 16 rows: fixed
    engine = LLMEngine(tiny.adapter, max_num_seqs=16)
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=8)
    engine.generate([tiny.encode("1 + 1 =")] * 16, [cfg] * 16)
    metrics = ServerMetrics(16)
    metrics.record_engine(engine)
    assert "s2d2_plan_fixed_choices_total 16" in metrics.render()

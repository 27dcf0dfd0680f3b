"""The cycle model (engine/planner/cycle.py): the chain over a block's slots, the ranking of AR and the
block sizes on both kinds of profile, and the hysteresis that keeps a choice priced within noise; in the
engine, a compute-bound projected load decodes AR, with AR greedy's tokens."""

from __future__ import annotations

import pytest

import s2d2
from conftest import REPO
from s2d2.bench.suites import load_problems
from s2d2.cost.generic import GENERIC_COST, HOST_MS_PER_ROW
from s2d2.cost.host_timed import HostTimedCost
from s2d2.cost.step_cost import FittedCost, roofline
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.planner.cycle import AR, CycleChoice, acceptance, block_ms, prices

SDAR_8B = REPO / "scripts" / "shapes" / "sdar-8b.json"


def test_the_chain_counts_cycles():
    def one_ms(q: float) -> float:
        return 1.0  # every forward 1 ms: a block's ms are its forwards

    assert block_ms(one_ms, 8, 1.0) == pytest.approx(2.0)  # all accepted: one cycle, two forwards
    assert block_ms(one_ms, 8, 0.0) == pytest.approx(16.0)  # a correction a cycle: eight cycles
    # two slots: one cycle, or two where the first draft is rejected (probability 1 - a)
    assert block_ms(one_ms, 2, 0.75) == pytest.approx(2.0 * (1 + 0.25))
    assert acceptance(4) > acceptance(8) > acceptance(16)


def _rank(cost, rows: int) -> list[int]:
    p = prices(cost, rows, (4, 8, 16), 72)
    return sorted(p, key=p.get)


def test_the_ranking_of_the_measured_sizes():
    # the built-in model on this CPU (BENCHMARKS.md, issue 50): B8 ahead from 4 to 16 rows, AR behind
    cpu = HostTimedCost(GENERIC_COST, HOST_MS_PER_ROW)
    assert _rank(cpu, 4) == [8, 16, 4, AR]
    assert _rank(cpu, 16) == [8, 4, 16, AR]
    # the SDAR-8B shape on the H200 roofline: B16 at 1-8 rows, B4 at 32, AR past the ridge
    h200 = roofline("roofline:h200", SDAR_8B)
    assert _rank(h200, 1) == [16, 8, 4, AR]
    assert _rank(h200, 8)[0] == 16
    assert _rank(h200, 32) == [4, 8, AR, 16]
    assert _rank(h200, 128)[0] == _rank(h200, 256)[0] == AR
    # every query token priced alike and nothing fixed: AR's two a token beat any draft's
    assert _rank(FittedCost((0.0, 0.0, 1.0, 0.0)), 4)[0] == AR


def test_a_choice_within_the_margin_does_not_flap():
    choice = CycleChoice(margin=0.03)
    assert choice.choose({AR: 2.0, 8: 1.0, 16: 1.02}) == 8
    assert choice.choose({AR: 2.0, 8: 1.02, 16: 1.0}) == 8  # within 3%: the last choice stays
    assert choice.choose({AR: 2.0, 8: 1.01, 16: 1.0}) == 8
    assert choice.choose({AR: 2.0, 8: 1.1, 16: 1.0}) == 16  # clearly cheaper: it moves
    assert choice.choose({AR: 2.0, 8: 1.0, 16: 1.02}) == 16
    assert choice.choose({AR: 2.0, 4: 1.0, 16: 1.02}) == 4  # other candidates: their own history


@pytest.mark.slow
def test_a_compute_bound_projected_load_decodes_ar_with_ar_tokens():
    tiny = s2d2.load("tiny-gsm", use_preset=False)
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 128)]
    ar = tiny.make_config(decoder="ar", max_new_tokens=6)
    auto = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=6)
    h200 = roofline("roofline:h200", SDAR_8B)
    ref = LLMEngine(tiny.adapter, max_num_seqs=128).generate(prompts, [ar] * 128)
    engine = LLMEngine(tiny.adapter, max_num_seqs=128, cost=h200)
    outs = engine.generate(prompts, [auto] * 128)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    stats = engine.stats()
    assert stats["plan_ar_choices"] == 128 and stats["plan_admissions"] == {"ar": 128}
    assert stats["plan_rows"] == 0  # no step planned: every row decoded as AR

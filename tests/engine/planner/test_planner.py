"""The cost-aware step planner (``plan=auto``): its choices, the token budget, and the lossless property
under any plan sequence (issue 25).

Every choice of the planner (plain, fused with 0..P groups, the span's first k positions, AR only)
commits AR greedy's tokens; a forced random choice per row and step must therefore give AR's output on
the built-in model and on the same-position fixtures, alone and in mixed batches.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import s2d2
from conftest import REPO, GapRecorder, examples, load_or_skip
from s2d2.bench.suites import load_problems
from s2d2.cost.host_timed import HostTimedCost
from s2d2.cost.step_cost import FittedCost
from s2d2.engine.draft_step import VerifyMode
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.planner.choice_matrices import Drafting, Fixed, RowSpan, build, row_costs, search
from s2d2.engine.planner.draft_or_ar import EXPLORE_ROWS
from s2d2.engine.planner.rows import fixed_tokens
from s2d2.engine.planner.whole_step_drafting import DraftingChoice
from s2d2.engine.planner.whole_step_verifying import whole_step
from s2d2.engine.step import apply_plans
from s2d2.errors import ConfigError

#: planned rows in batches are planned step by step here, whatever their load (conftest)
pytestmark = pytest.mark.usefixtures("step_by_step_planning")

BLOCK_SIZES = (2, 4, 8, 16)


@pytest.fixture(scope="module", params=["tiny-gsm", "sdar", "llada2"])
def model(request):
    return load_or_skip(request.param)


@pytest.fixture(scope="module")
def tiny():
    return load_or_skip("tiny-gsm")


# ------------------------------------------------------------------------------ the arithmetic
spans = st.builds(
    lambda alpha, off, start, extra, nxt, pos, br, ctx: RowSpan(
        alpha, off, start, start + len(alpha) + extra, nxt if extra == 0 else 0, pos, br, ctx, 9
    ),
    st.lists(st.floats(0, 1), min_size=1, max_size=16),
    st.integers(0, 3),
    st.integers(0, 8),
    st.integers(0, 4),
    st.sampled_from([0, 8]),
    st.integers(-1, 4),
    st.integers(1, 2),
    st.integers(0, 300),
)


@settings(max_examples=examples(150), deadline=None)
@given(rows=st.lists(spans, min_size=1, max_size=6), m=st.floats(0, 1), share=st.floats(0, 2))
def test_matrices_and_the_small_path_agree(rows, m, share):
    """build() + search()'s costs per choice equal row_costs()' (the two paths of the planner)."""
    ch = build(rows)
    from s2d2.engine.planner import choice_matrices as pc

    for i, r in enumerate(rows):
        n = len(r.alpha)
        small = {col: (c, tok, e) for c, col, tok, e in row_costs(r, m, share, 0.1)}
        cols = [c for c in range(ch.valid.shape[1]) if ch.valid[i, c]]
        mapped = [c if c < ch.n_max else n + c - ch.n_max for c in cols]
        assert sorted(mapped) == sorted(small)
        for c, mc in zip(cols, mapped, strict=True):
            later = m * ch.rest[i, c] + ch.cont[i, c] * share
            hit = ch.hit[i, c] * pc.HIT_WORTH * (m * ch.draft[i] + share)
            cost = m * ch.tokens[i, c] + later + 0.1 * ch.groups[i, c] - hit
            assert cost == pytest.approx(small[mc][0], abs=1e-9)
            assert ch.tokens[i, c] == small[mc][1]
            assert ch.expected[i, c] == pytest.approx(small[mc][2])


def _span(alpha, nxt=0, positions=4):
    n = len(alpha)
    return RowSpan(alpha, 1, 0, n, nxt, positions, 1, 100, n + 1)


def _pick(cost, rows):
    ch = build(rows)
    fixed = Fixed(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0.0)
    start = np.argmax(np.where(ch.valid, np.arange(ch.valid.shape[1]), -1), axis=1)
    picks, _, _ = search(cost, ch, np.array([r.context for r in rows]), fixed, start, 0.0)
    return ch, picks


class _Ridge:
    """A step cost with a memory floor: ``max(tokens, floor)`` ms (a roofline's shape, tiny)."""

    def __init__(self, floor: float):
        self.floor = floor

    def predict_totals(self, rows, tokens, attention, kv, padded):
        return max(float(tokens), self.floor)


def test_the_whole_step_check_prices_each_choice_at_its_own_shape():
    """Eight rows about to draft (10 query tokens, 4 expected tokens and an 8-token verification each;
    AR only: 2 tokens for 1). Under a memory floor the drafts cost nothing more than AR does, so every
    row drafts whatever the per-row picks said; where every token costs, every row takes AR only, but
    only once AR only everywhere is allowed (the acceptance measured)."""
    R = 8
    step = DraftingChoice(
        np.full(R, 10), np.full(R, 100), list(range(R)), [2] * R, [(4.0, 8, 2)] * R, 0.0, 0, []
    )
    assert step.best(_Ridge(1000.0), [True] * R, all_ar=True) == [False] * R
    assert step.best(_Ridge(0.0), [False] * R, all_ar=True) == [True] * R
    assert step.best(_Ridge(0.0), [False] * R, all_ar=False) == [False] * R
    mixed = [True, False] * (R // 2)
    assert (
        step.ratio(_Ridge(0.0), [True] * R)
        > step.ratio(_Ridge(0.0), mixed)
        > step.ratio(_Ridge(0.0), [False] * R)
    )


def test_verifying_picks_that_overrun_the_ridge_are_cut_back():
    """Eight verifying rows, plain 10 query tokens each, fused 30 saving 5 ms each, all picked at the
    plain shape's marginal cost of zero (under a 150 ms floor). Fused everywhere is 240 ms less 40: the
    check keeps some of them, as many as fit under the floor (each fused row saves 5 ms there); with a
    floor above every shape it keeps all; with no upgrade it changes nothing."""
    R = 8
    plain, fused = (0.0, 7, 10, 3.0), (-5.0, 9, 30, 3.0)
    tokens, contexts = np.full(R, 10), np.full(R, 100)

    def total(picks, floor):
        return max(float(sum(p[2] for p in picks)), floor) + sum(p[0] for p in picks)

    out = whole_step(_Ridge(150.0), [fused] * R, [plain] * R, tokens, contexts, 0.0)
    assert 0 < out.count(fused) < R and out.count(fused) + out.count(plain) == R
    assert total(out, 150.0) < min(total([plain] * R, 150.0), total([fused] * R, 150.0))
    assert whole_step(_Ridge(1000.0), [fused] * R, [plain] * R, tokens, contexts, 0.0) == [fused] * R
    assert whole_step(_Ridge(150.0), [plain] * R, [plain] * R, tokens, contexts, 0.0) == [plain] * R


def test_a_fixed_cost_step_verifies_everything_and_a_token_bound_step_verifies_little():
    confident = [0.95] * 8
    unsure = [0.9, 0.3, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]
    # the step's cost is its fixed part (one row at low load): verify the whole span
    ch, picks = _pick(FittedCost((5.0, 0.0, 0.001, 0.0)), [_span(confident, positions=-1)])
    assert picks[0] == 7
    # every query token costs the same and nothing else does (a compute-bound step): the unlikely
    # positions are not worth their tokens
    ch, picks = _pick(FittedCost((0.0, 0.0, 1.0, 0.0)), [_span(unsure, positions=-1)] * 32)
    assert all(p <= 1 for p in picks)
    # fused groups are worth their tokens when a forward's size barely matters
    ch, picks = _pick(FittedCost((5.0, 0.0, 0.0001, 0.0)), [_span(unsure, nxt=8)])
    assert picks[0] >= ch.n_max + 1


def test_prompt_tokens_in_the_step_do_not_make_dear_drafts_look_cheap():
    """Drafting rows whose draft costs more per committed token than AR only (a compute-bound step) go AR
    only, with or without another row's prompt chunk in the step: the chunk's time is spent whatever is
    chosen, so it must not lower the ratio a choice has to beat (it used to turn every row to a draft)."""
    D = 32
    drafting = Drafting(
        np.tile([3.0, 1.0], (D, 1)),
        np.tile([10, 2], (D, 1)),
        np.tile([12, 0], (D, 1)),
        np.tile([2, 1], (D, 1)),
        np.full(D, 100),
    )
    ch = build([])
    cost = FittedCost((0.0, 0.0, 1.0, 0.0))
    for prompt in (0, 4000):
        tokens = np.array([prompt] if prompt else [], dtype=np.int64)
        fixed = Fixed(tokens, np.zeros(tokens.size, dtype=np.int64), 0.0, prompt)
        _, dpicks, _ = search(cost, ch, np.zeros(0, dtype=np.int64), fixed, np.zeros(0, int), 0.0, drafting)
        assert dpicks.tolist() == [1] * D, prompt


def test_fixed_tokens_match_the_segments(tiny):
    """The planner's token counts are what the runner feeds (every action of a fused auto run)."""
    engine = LLMEngine(tiny.adapter, max_num_seqs=8)
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=24)
    for p in load_problems("tiny-gsm", "test", 3):
        engine.add_request(tiny.encode(p["question"]), cfg)
    seen = 0
    while engine.has_unfinished():
        for req in engine.scheduler.running:
            if req.action is not None and not req.status.done:
                apply_plans(engine.planner.plan([req]))
                assert fixed_tokens(req, engine.runner.prefill_chunk) == engine.runner.layout(req).n
                seen += 1
        engine.step()
    assert seen > 10


# ------------------------------------------------------------------------------ lossless, any plan
def _forcing(seed: int):
    rng = random.Random(seed)
    return lambda req, columns: rng.choice(columns)


def _check(model, prompt: list[int], max_new: int, seed: int) -> None:
    common = dict(max_new_tokens=max_new, ignore_eos=True)
    recorder = GapRecorder(model.adapter)
    ar_cfg = model.make_config(decoder="ar", causal_cache=True, **common)
    ar = LLMEngine(recorder, max_num_seqs=1).generate([prompt], [ar_cfg])[0]
    # a near-tie of AR's own choice (random fixture weights meet top-2 gaps of 1e-6): another forward's
    # shape may break it either way, so such examples say nothing about the plans
    assume(recorder.min_gap > 1e-4)
    engine = LLMEngine(model.adapter, max_num_seqs=len(BLOCK_SIZES) + 2)
    engine.planner.force = _forcing(seed)
    cfgs = [model.make_config(preset="lossless-auto", block_size=b, **common) for b in BLOCK_SIZES]
    cfgs.append(model.make_config(preset="lossless", block_size=4, plan="auto", **common))
    cfgs.append(model.make_config(preset="lossless-fused", block_size=8, **common))  # plan fixed
    outs = engine.generate([prompt] * len(cfgs), cfgs)
    for cfg, out in zip(cfgs, outs, strict=True):
        assert out.token_ids == ar.token_ids, f"B{cfg.block_size} {cfg.plan}: {out.token_ids} != AR"
        assert out.stats.fallback_commits == 0
    alone = LLMEngine(model.adapter, max_num_seqs=1)
    alone.planner.force = _forcing(seed + 1)
    assert alone.generate([prompt], cfgs[2:3])[0].token_ids == ar.token_ids


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_any_plan_sequence_equals_ar(model, data):
    _any_plan_sequence(model, data)


def _any_plan_sequence(model, data):
    info = model.info
    token = st.integers(0, info.vocab_size - 1).filter(lambda t: t != info.mask_token_id)
    prompt = data.draw(st.lists(token, min_size=1, max_size=20), label="prompt")
    max_new = data.draw(st.integers(1, 24), label="max_new_tokens")
    _check(model, prompt, max_new, data.draw(st.integers(0, 2**31), label="seed"))


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_plan_sequence_equals_ar_on_sdar_moe(sdar_moe_model, data):
    """The same on the SDAR-MoE checkpoint (routed experts), with fewer examples."""
    _any_plan_sequence(sdar_moe_model, data)


def test_every_mode_is_taken_and_auto_batch_equals_alone(tiny):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 12)]
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=48)
    ar_cfg = tiny.make_config(decoder="ar", max_new_tokens=48)
    ar = [o.token_ids for o in LLMEngine(tiny.adapter, max_num_seqs=12).generate(prompts, [ar_cfg] * 12)]
    forced = LLMEngine(tiny.adapter, max_num_seqs=12)
    forced.planner.force = _forcing(0)
    assert [o.token_ids for o in forced.generate(prompts, [cfg] * 12)] == ar
    stats = forced.stats()
    assert all(stats[f"plan_{m.value.replace('-', '_')}"] > 0 for m in VerifyMode)
    batch = LLMEngine(tiny.adapter, max_num_seqs=12)
    assert [o.token_ids for o in batch.generate(prompts, [cfg] * 12)] == ar
    alone = [LLMEngine(tiny.adapter, max_num_seqs=1).generate([p], [cfg])[0].token_ids for p in prompts[:4]]
    assert alone == ar[:4]
    s = batch.stats()
    assert s["plan_rows"] > 0 and s["plan_ms_per_step"] > 0 and s["plan_predicted_ms_per_step"] > 0


def test_without_a_budget_every_batch_size_plans_in_one_python_pass(tiny, monkeypatch):
    """The matrix search is for token budgets only: at 16 rows without one the planner still plans
    (cheaper in the engine than the matrices), and its tokens stay AR's."""
    from s2d2.engine.planner import step_planner as planner_module

    def no_matrices(*args, **kwargs):
        raise AssertionError("the matrix search ran without a token budget")

    monkeypatch.setattr(planner_module, "search", no_matrices)
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 16)]
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=32)
    ar_cfg = tiny.make_config(decoder="ar", max_new_tokens=32)
    ar = [o.token_ids for o in LLMEngine(tiny.adapter, max_num_seqs=16).generate(prompts, [ar_cfg] * 16)]
    engine = LLMEngine(tiny.adapter, max_num_seqs=16)
    assert [o.token_ids for o in engine.generate(prompts, [cfg] * 16)] == ar
    s = engine.stats()
    assert s["plan_errors"] == 0 and s["plan_rows"] > 0 and s["mean_rows_per_forward"] > 8


def test_the_fixed_rows_refreshed_after_ar_only_picks_equal_a_fresh_pass(tiny, monkeypatch):
    """The planner refreshes its view of the rows it does not choose for only where rows about to draft
    took AR only; at every step of a 16-row run (AR-only picks included) that equals a fresh pass."""
    from s2d2.engine.planner.step_planner import StepPlanner

    refreshed, checked = StepPlanner._refreshed, []

    def compare(self, fixed, others, changed):
        out = refreshed(self, fixed, others, changed)
        fresh = self._fixed(others, {id(r) for r in changed})  # rows are not changed before the step applies
        assert out.tokens.tolist() == fresh.tokens.tolist()
        assert out.contexts.tolist() == fresh.contexts.tolist()
        assert out.value == pytest.approx(fresh.value) and out.sunk == fresh.sunk
        checked.append(len(changed))
        return out

    monkeypatch.setattr(StepPlanner, "_refreshed", compare)
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 32)]
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=32)
    token_bound = FittedCost((0.0, 0.0, 1.0, 0.0))  # AR only is often cheaper: rows change
    LLMEngine(tiny.adapter, max_num_seqs=16, cost=token_bound).generate(prompts, [cfg] * len(prompts))
    assert checked and sum(checked) > 0


def test_a_prompt_tail_does_not_make_the_first_draft_look_cheap(tiny):
    """A row's first forward after a folded prompt carries the prompt whether it drafts or takes AR only:
    left out of both prices, AR only wins where query tokens are all that cost (it used to weigh on AR's
    one token as on a draft's several, so every first step drafted). The first rows of a step with no
    acceptance measured yet still draft, so that it will be."""
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 4)]
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=16)
    token_bound = FittedCost((0.0, 0.0, 1.0, 0.0))
    engine = LLMEngine(tiny.adapter, max_num_seqs=4, cost=token_bound)
    for p in prompts:
        engine.add_request(p, cfg)
    engine.step()  # the prompts and each row's first draft or AR-only step, in one forward
    assert 1 <= engine.stats()["plan_ar_only"] <= len(prompts) - EXPLORE_ROWS
    ar_cfg = tiny.make_config(decoder="ar", max_new_tokens=16)
    ar = LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [ar_cfg] * 4)
    outs = LLMEngine(tiny.adapter, max_num_seqs=4, cost=token_bound).generate(prompts, [cfg] * 4)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]


def test_the_blocks_prompt_slots_are_sunk_too(tiny):
    """A first forward after a folded prompt also feeds the prompt slots of its first block (the block
    starts inside the prompt) whether it drafts or takes AR only. On a compute-bound step (256 rows of an
    SDAR-8B-shaped model on the H200 roofline) they commit nothing either way: left out of both prices,
    every row but the explorers takes AR only there, as AR would (counted, they made half the rows
    draft)."""

    from s2d2.cost.step_cost import roofline

    shape = REPO / "scripts" / "shapes" / "sdar-8b.json"
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 256)]
    cfg = tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=16)
    engine = LLMEngine(tiny.adapter, max_num_seqs=256, cost=roofline("roofline:h200", shape))
    assert any(len(p) % 8 for p in prompts)  # blocks that start inside their prompt
    for p in prompts:
        engine.add_request(p, cfg)
    engine.step()
    assert engine.stats()["plan_ar_only"] == len(prompts) - EXPLORE_ROWS


# ------------------------------------------------------------------------------ the budget
def test_the_token_budget_is_kept_and_tokens_do_not_change(tiny):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 10)]
    cfgs = [tiny.make_config(preset="lossless-auto", block_size=8, max_new_tokens=32)] * 6
    cfgs += [tiny.make_config(preset="lossless-fused", block_size=8, max_new_tokens=32)] * 4
    ar = LLMEngine(tiny.adapter, max_num_seqs=10).generate(
        prompts, [tiny.make_config(decoder="ar", max_new_tokens=32)] * 10
    )
    budget = 160
    engine = LLMEngine(tiny.adapter, max_num_seqs=10, max_num_batched_tokens=budget, prefill_chunk=64)
    sizes = []
    run = engine.runner.run

    def counting(rows, segments):
        sizes.append(sum(s.n for s in segments))
        return run(rows, segments)

    engine.runner.run = counting
    outs = engine.generate(prompts, cfgs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    assert max(sizes) <= budget
    s = engine.stats()
    assert s["plan_over_budget_steps"] > 0 and s["plan_deferred_rows"] + s["plan_degraded_rows"] > 0


def test_a_budget_below_one_row_is_refused(tiny):
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        LLMEngine(tiny.adapter, max_num_batched_tokens=8)


def test_plan_is_a_setting():
    with pytest.raises(ConfigError, match="plan"):
        s2d2.DecodeConfig.build(plan="sometimes")
    cfg = s2d2.DecodeConfig.build(preset="lossless-auto")
    assert cfg.plan == "auto" and cfg.fuse and not cfg.fusion_blockers()


def test_the_trace_shows_each_plan(tiny):
    q = load_problems("tiny-gsm", "test", 1)[0]["question"]
    out = tiny.generate(q, preset="lossless-auto", block_size=8, trace=True, max_new_tokens=32)
    plans = [s.plan for s in out.trace if s.plan is not None]
    assert plans and all(p["mode"] in {m.value for m in VerifyMode} and p["k"] >= 1 for p in plans)
    assert all(p["predicted_ms"] > 0 for p in plans)
    assert all(p["measured_ms"] is not None for p in plans[:-1])


def test_the_trace_views_show_the_plans(tiny):
    from s2d2.tracing.render_html import render_html
    from s2d2.tracing.view import build_view

    q = load_problems("tiny-gsm", "test", 2)[1]["question"]
    out = tiny.generate(q, preset="lossless-auto", block_size=8, trace=True, max_new_tokens=24)
    view = build_view(out.trace, tiny.encode(q), 8, str, stats=out.stats)
    labels = [s.plan for s in view.steps if s.plan]
    assert labels and all(lb.startswith("plan ") and "ms predicted" in lb for lb in labels)
    assert labels[0] in render_html(view)


def test_metrics_expose_the_planner_counters(tiny):
    from s2d2.serving.metrics import ServerMetrics

    engine = LLMEngine(tiny.adapter, max_num_seqs=2)
    q = load_problems("tiny-gsm", "test", 1)[0]["question"]
    engine.generate([tiny.encode(q)], [tiny.make_config(preset="lossless-auto", max_new_tokens=16)])
    metrics = ServerMetrics(2)
    metrics.record_engine(engine)
    text = metrics.render()
    rows = engine.stats()["plan_rows"]
    assert rows > 0 and f"s2d2_plan_rows_total {rows}" in text and "s2d2_plan_ar_only_total" in text
    assert "s2d2_plan_block_choices_total 1" in text  # lossless-auto offers B4, B8 and B16


def test_bench_batch_rows_carry_the_planners_prediction(tiny):
    from s2d2.bench.throughput import run_throughput

    out = run_throughput(tiny, n=3, limits=(1,), configs=("ar", "lossless-auto"), max_new_tokens=16)
    rows = {r["config"]: r for r in out["rows"]}
    auto = rows["lossless-auto"]
    assert auto["predicted_ms_per_step"] > 0 and auto["plan_ms_per_step"] > 0
    assert auto["forward_ms_per_step"] > 0
    # every request planned here (step_by_step_planning), at the size the cycle model prices best on the
    # CPU at one row: B16 (plain B16 measured ahead of B8 there)
    assert auto["plan_mean_block_size"] == 16 and auto["plan_admissions"] == {"planned-16": 3}
    assert "predicted_ms_per_step" not in rows["ar"]  # no profile given and nothing planned
    assert "plan_mean_block_size" not in rows["ar"]


def test_a_failing_planner_does_not_stop_the_step(tiny, monkeypatch):
    engine = LLMEngine(tiny.adapter, max_num_seqs=4)

    def broken(running):
        raise RuntimeError("planner bug")

    monkeypatch.setattr(engine.planner, "_plan", broken)
    q = load_problems("tiny-gsm", "test", 1)[0]["question"]
    cfg = tiny.make_config(preset="lossless-auto", max_new_tokens=16)
    out = engine.generate([tiny.encode(q)], [cfg])[0]
    ar_cfg = tiny.make_config(decoder="ar", max_new_tokens=16)
    ar = LLMEngine(tiny.adapter).generate([tiny.encode(q)], [ar_cfg])[0]
    assert out.status == "finished" and out.token_ids == ar.token_ids
    assert engine.stats()["plan_errors"] > 0


def test_host_time_is_charged_per_row_only_with_a_profile_of_this_host(tiny):
    """With a profile of this host the planner prices choices with a host time per row (a choice taking
    more steps pays it more often); a roofline profile (another machine's forwards) has none."""
    raw = FittedCost((1.0, 0.1, 0.01, 0.0))
    cost = HostTimedCost(raw, 0.5)
    plain = raw.predict_totals(4, 40, 0.0, 0, 0.0)
    assert cost.predict_totals(4, 40, 0.0, 0, 0.0) == pytest.approx(plain + 4 * 0.5)
    engine = LLMEngine(tiny.adapter, max_num_seqs=4)
    assert engine.planner.host_time is not None and engine.planner.host_time.host_ms_per_row > 0
    roofline = s2d2.load("tiny-gsm", cost_profile="roofline:h200", use_preset=False).engine
    assert roofline.planner.host_time is None

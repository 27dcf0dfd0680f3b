"""The cost-aware step planner (``plan=auto``): each step, choose every verifying row's verification.

Runs in :meth:`~.llm_engine.LLMEngine.step` after admission and before the segments are built, on the
host values the previous step brought back (no device work, no host sync). For every row about to
verify whose settings are the lossless family (strict acceptance, verification on every step, one-token
quota, causal cache; a same-position model) and ask for ``plan="auto"``, it chooses one of

* ``PLAIN``: the 2L verification of the whole routed span;
* ``FUSED``: the same forward carrying pre-draft groups for 0..``predraft_positions`` rejection
  positions (and the next block when the span reaches the block's end), when the settings fuse;
* ``PREFIX_K``: the 2L verification of only the span's first k positions;
* ``AR_ONLY``: k = 1, the smallest forward: the AR prediction at the first undecided position.

Every choice commits AR greedy's tokens (strict acceptance: accepted drafts equal the AR argmax, the
correction is the AR argmax), so the planner changes speed only. The drafts a verification leaves
unverified or unused are verified by the next step (stale reuse) instead of drafting afresh.

Objective: the batch's expected committed tokens per predicted millisecond, ``sum(v_r) / T(shape)``
(Dinkelbach: with ``lam`` the current ratio, a row takes the choice maximising ``v - lam * cost``).
With ``a_i`` the drafter's acceptance estimates over the span and ``r_j = prod_{i<j} a_i`` the
probability that position j is reached, a verification of k positions commits ``E_k = sum_{j<k} r_j``
tokens (accepted drafts plus the correction). A verifying row's choices all commit, now or at its next
verification, the span's ``E_n``, so they differ in cost only: this step's query tokens at the step's
marginal ms per token; for a prefix of k positions, the later verification of the rest; for a fused
forward, its groups' host work less, with each group's hit probability, the draft forward a hit saves
(:data:`~.choice_matrices.HIT_WORTH` of it). A row about to draft chooses between a draft (its
verification's expected tokens, two steps) and AR only (one token, one step). The choices and their
prices are :mod:`.choice_matrices`.

Two paths compute the same prices. Without a token budget, one pass in plain Python: each row about to
draft takes AR only where that is clearly cheaper per committed token than its draft and verification
(:mod:`.draft_or_ar`; with a roofline profile, also checked as a whole step, :mod:`.whole_step_drafting`),
then each verifying row takes its cheapest choice at the resulting shape where it is clearly cheaper
than plain verification (:func:`~.choice_matrices.row_costs`); in the engine this costs less than the
matrices at every batch size measured (BENCHMARKS.md: numpy's per-call cost on small arrays dominates
them between forwards).
``max_num_batched_tokens`` (as vLLM's): the step's query tokens are kept within it
(:mod:`.budget`), over the matrices of :mod:`.choice_matrices` and their search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...cost.generic import (
    GENERIC_COST,
    HOST_MS_PER_AR_ROW,
    HOST_MS_PER_GROUP,
    HOST_MS_PER_ROW,
    HOST_MS_PER_STEP,
)
from ...cost.host_timed import HostTimedCost
from ...cost.step_cost import FittedCost, StepCost
from ..draft_step import Plan
from ..request import Action, Request
from ..step.plans import RowPlan, StepPlan
from .budget import fit_budget
from .choice_matrices import (
    MARGIN,
    Drafting,
    Fixed,
    RowSpan,
    build,
    column_plan,
    plan_of,
    point,
    predict,
    row_costs,
    search,
)
from .draft_or_ar import (
    EXPLORE_ROWS,
    PRIOR_ACCEPTANCE,
    ar_only_plan,
    ar_only_value,
    draft_value,
    eligible,
    measured_acceptance,
    prefers_ar,
    prompt_tail,
)
from .regime import MIN_FIXED_SHARE, Regime, admit
from .rows import (
    expected_tokens,
    fixed_tokens,
    plain_tokens,
    plannable,
    row_span,
    span_alpha,
    verifying,
)
from .stats import PlannerStats
from .whole_step_drafting import DraftingChoice
from .whole_step_verifying import whole_step


class StepPlanner:
    """The planning phase of an engine step (see the module docstring)."""

    def __init__(
        self,
        cost: StepCost | None,
        *,
        prefill_chunk: int,
        max_num_batched_tokens: int | None = None,
    ):
        self.cost = cost if cost is not None else GENERIC_COST
        measured = isinstance(self.cost, FittedCost)  # a profile of this host: its host time counts too
        self.host_ms_per_group = HOST_MS_PER_GROUP if measured else 0.0
        #: what the choices are priced with: the profile, plus :data:`HOST_MS_PER_STEP` and
        #: :data:`HOST_MS_PER_ROW` a row (:data:`HOST_MS_PER_AR_ROW` for an AR step) where the profile
        #: was measured on this host (:mod:`.host_timed`)
        host = HostTimedCost(self.cost, HOST_MS_PER_ROW, HOST_MS_PER_STEP, HOST_MS_PER_AR_ROW)
        self.host_time = host if measured else None
        self.decide = self.host_time if self.host_time is not None else self.cost
        #: whether rows about to draft are also checked as a whole step (:mod:`.whole_step_drafting`): for a
        #: profile with a ridge (a roofline's compute and memory bounds); a fitted profile is linear in a
        #: shape's totals, where the per-row prices at one shape rank the choices already
        self.whole_step = not measured
        self.prefill_chunk = prefill_chunk
        self.max_num_batched_tokens = max_num_batched_tokens
        self.stats = PlannerStats()
        #: this step's records for the planned rows' traces (the engine fills in the measured forward)
        self._traced: list[dict[str, Any]] = []
        self._deferred_others: set[int] = set()
        self._rows: list[RowPlan] = []  # this step's plans, in the order chosen
        #: this step's acceptance prior for rows with few verified drafts: the planned rows' rate together
        #: (:func:`.draft_or_ar.measured_acceptance`), and whether it is measured (else the assumed prior)
        self._prior, self._measured = 0.0, False
        #: tests: ``force(req, columns)`` picks each planned row's choice among its valid columns (k - 1
        #: for a prefix of k positions, span + g for fused with g groups) instead of the cost model
        self.force: Callable[[Request, list[int]], int] | None = None
        #: how a plan=auto request decodes (AR, fixed or planned, and its block size), chosen when it is
        #: added (:mod:`.regime`); its ``min_share`` 0 plans every such request at the block size the
        #: older "bigger block about free" rule picks (the tests of the per-step planner do)
        self.regime = Regime(self.decide, measured, self.cost, MIN_FIXED_SHARE)

    min_fixed_share = property(
        lambda self: self.regime.min_share, lambda self, v: setattr(self.regime, "min_share", v)
    )

    def admit(self, config: Any, sizes: Sequence[int], n_prompt: int, rows: int, fits: Callable) -> Any:
        """``config`` of a plan=auto request decided for ``rows`` rows (:func:`.regime.admit`)."""
        return admit(self.regime, self.stats, config, sizes, n_prompt, rows, fits, self.force is not None)

    def plan(self, running: Sequence[Request]) -> StepPlan:
        """Choose each planned row's verification, or AR only in place of its draft: the plans, for the
        step to apply (:func:`~..step.apply_plans`), and the ids (``id(req)``) of rows deferred to a later
        step by the token budget. Reads the rows, writes none. A failure of the planning itself is
        counted (``plan_errors``) and the step runs as the rows stand: every choice keeps AR greedy's
        tokens."""
        self._rows, self._traced = [], []
        try:
            deferred = self._plan(running)
        except Exception:  # the planner must not stop a step; it only changes speed
            self.stats.errors += 1
            return StepPlan()
        return StepPlan(self._rows, deferred, self._traced)

    def _plan(self, running: Sequence[Request]) -> set[int]:
        t0 = time.perf_counter()
        if self.max_num_batched_tokens is None and not any(r.auto_plan for r in running):
            return set()  # nothing to plan (AR, fixed settings, plan=auto rows decoding fixed by load)
        live = [r for r in running if r.action is not None and not r.abort_requested and not r.status.done]
        planned, others = [], []
        for r in live:
            (planned if plannable(r) else others).append(r)
        drafting = [r for r in others if eligible(r)]
        measured = measured_acceptance(live) if drafting else None
        self._prior = PRIOR_ACCEPTANCE if measured is None else measured
        self._measured = measured is not None
        rows_before = self.stats.rows
        if not planned and not drafting and self.max_num_batched_tokens is None:
            return set()
        spans = [row_span(r) for r in planned]
        small = self.force is not None or self.max_num_batched_tokens is None
        if drafting and small:
            fixed = self._fixed(others)
            fixed = self._refreshed(fixed, others, self._draft_or_ar(drafting, spans, others, fixed))
            drafting = []
        else:
            if drafting:
                ids = {id(r) for r in drafting}
                others = [r for r in others if id(r) not in ids]
            fixed = self._fixed(others)
        if self.force is not None:
            plans, ms = self._forced(planned, spans), 0.0
        elif small:
            plans, ms = self._small(spans, fixed)
        else:
            plans, ms = self._matrices(planned, spans, others, fixed, drafting)
        deferred = {id(r) for r, plan in zip(planned, plans, strict=True) if plan is None}
        deferred |= self._deferred_others
        if not planned:
            ms = predict(self.decide, fixed.tokens, fixed.contexts)
        if planned or self._traced or self.stats.rows > rows_before:
            host = self.host_time.host_ms(len(live)) if self.host_time is not None else 0.0
            self._apply(planned, plans, ms - host)  # reported beside the measured forward
        self.stats.seconds += time.perf_counter() - t0
        return deferred

    def _fixed(self, others: list[Request], ar: set[int] | None = None) -> Fixed:
        """``others``' query tokens and expected tokens as they stand (rows in ``ar``: as the AR-only
        steps planned for them)."""
        ar = ar or set()
        tokens = [r.lead_fed() if id(r) in ar else fixed_tokens(r, self.prefill_chunk) for r in others]
        value = sum(ar_only_value(r) for r in others if id(r) in ar)
        rest = [r for r in others if verifying(r) and id(r) not in ar]
        return Fixed(
            np.array(tokens, dtype=np.int64),
            np.array([r.state.length if r.state is not None else 0 for r in others], dtype=np.int64),
            value + sum(expected_tokens(span_alpha(r.pending, r.pending.span_len)) for r in rest),
            sum(t for r, t in zip(others, tokens, strict=True) if r.action == Action.PREFILL),
        )

    def _refreshed(self, fixed: Fixed, others: list[Request], changed: list[Request]) -> Fixed:
        """``fixed`` after the rows ``changed`` (rows of ``others`` that were about to draft) took AR only:
        their query tokens now, and their expected token where they verify (what :meth:`_fixed` of
        ``others`` gives, without a second pass over every row)."""
        if not changed:
            return fixed
        where = {id(r): i for i, r in enumerate(others)}
        tokens, value = fixed.tokens.copy(), fixed.value
        for r in changed:
            tokens[where[id(r)]] = r.lead_fed()
            value += ar_only_value(r)
        return Fixed(tokens, fixed.contexts, value, fixed.sunk)

    def _draft_or_ar(
        self, drafting: list[Request], spans: list[RowSpan], others: list[Request], fixed: Fixed
    ) -> list[Request]:
        """Rows about to draft (among ``others``): AR only instead where it is cheaper per token
        (:mod:`.draft_or_ar`), at the step's marginal ms per token and fixed share per row with plain
        verification; while no acceptance is measured, the first :data:`~.draft_or_ar.EXPLORE_ROWS` of
        them draft whatever the prices say (so that it will be). With a profile that is not linear in
        the shape (:attr:`whole_step`), then the best of those picks, every row drafting and every row
        AR only, each priced at its own shape (:mod:`.whole_step_drafting`). ``fixed``: ``others`` as they
        stand. Returns the rows that took AR only."""
        plain = np.array([plain_tokens(s) for s in spans], dtype=np.int64)
        tokens = np.concatenate([plain, fixed.tokens])
        contexts = np.concatenate([np.array([s.context for s in spans], dtype=np.int64), fixed.contexts])
        _, m, share = point(self.decide, tokens, contexts)
        where = {id(r): len(spans) + i for i, r in enumerate(others)}
        at = [where[id(r)] for r in drafting]
        if self.force is not None:
            picks = [self.force(req, [0, 1]) == 1 for req in drafting]
        else:
            explore = 0 if self._measured else EXPLORE_ROWS
            picks = [
                i >= explore and prefers_ar(r, t, m, share, self._prior)
                for i, (r, t) in enumerate(zip(drafting, tokens[at].tolist(), strict=True))
            ]
            if self.whole_step:
                step = DraftingChoice(
                    tokens,
                    contexts,
                    at,
                    [r.lead_fed() for r in drafting],
                    [draft_value(r, self._prior) for r in drafting],
                    sum(expected_tokens(s.alpha) for s in spans) + fixed.value,
                    fixed.sunk + sum(prompt_tail(r) for r in drafting),
                    [s.draft_tokens for s in spans],
                )
                picks = step.best(self.decide, picks, all_ar=self._measured)  # all AR: none measured
        changed = [req for req, ar in zip(drafting, picks, strict=True) if ar]
        for req in changed:
            self._ar_only(req)
        return changed

    def _forced(self, planned: list[Request], spans: list[RowSpan]) -> list[Plan]:
        """Each row's choice from :attr:`force` (tests: any mix of modes, changing every step)."""
        self._deferred_others = set()
        plans = []
        for req, s in zip(planned, spans, strict=True):
            options = {col: (tokens, e) for _, col, tokens, e in row_costs(s, 0.0, 0.0, 0.0)}
            col = self.force(req, sorted(options))
            plans.append(column_plan(col, len(s.alpha), *options[col]))
        return plans

    def _small(self, spans: list[RowSpan], fixed: Fixed) -> tuple[list[Plan], float]:
        """Each planned row's cheapest choice at the shape of plain verification (plain Python), where it
        is clearly cheaper than plain (:data:`~.choice_matrices.MARGIN`)."""
        self._deferred_others = set()
        defaults = [plain_tokens(s) for s in spans]
        toks = np.array(defaults + fixed.tokens.tolist(), dtype=np.int64)
        ctx = np.array([s.context for s in spans] + fixed.contexts.tolist(), dtype=np.int64)
        ms0, m, share = point(self.decide, toks, ctx)
        picks, plains = [], []
        for s in spans:
            options = row_costs(s, m, share, self.host_ms_per_group)
            plain = options[len(s.alpha) - 1]
            pick = min(options)
            # not clearly better than plain (choice_matrices.MARGIN): plain
            picks.append(plain if plain[0] - pick[0] < MARGIN * ms0 / toks.size else pick)
            plains.append(plain)
        if self.whole_step:  # a ridge: the picks priced at plain's shape may overrun it (see whole_step)
            picks = whole_step(self.decide, picks, plains, toks, ctx, m)
        plans = []
        for i, (s, (_, col, tokens, expected)) in enumerate(zip(spans, picks, strict=True)):
            plans.append(column_plan(col, len(s.alpha), tokens, expected))
            toks[i] = tokens
        return plans, predict(self.decide, toks, ctx)

    def _matrices(
        self,
        planned: list[Request],
        spans: list[RowSpan],
        others: list[Request],
        fixed: Fixed,
        drafting: list[Request],
    ) -> tuple[list[Plan | None], float]:
        """A token budget: the matrix search (drafting rows choose AR only or not in it), then the
        budget."""
        ch = build(spans)
        ctx = np.array([s.context for s in spans], dtype=np.int64)
        start = np.argmax(np.where(ch.valid, np.arange(ch.valid.shape[1]), -1), axis=1)
        d = self._drafting(drafting)
        picks, dpicks, ms = search(self.decide, ch, ctx, fixed, start, self.host_ms_per_group, d)
        ar = set()
        for req, pick in zip(drafting, dpicks, strict=True):
            if pick == 1:
                self._ar_only(req)
                ar.add(id(req))
        deferred: set[int] = set()
        budget = self.max_num_batched_tokens
        if budget is not None:
            rest = others + drafting
            fixed = self._fixed(rest, ar) if drafting else fixed
            picks, deferred = fit_budget(budget, planned, rest, ch, picks, fixed, self.stats)
        self._deferred_others = {d for d in deferred if d not in {id(r) for r in planned}}
        plans = [
            None if id(r) in deferred else plan_of(ch, i, int(picks[i]), len(spans[i].alpha))
            for i, r in enumerate(planned)
        ]
        return plans, ms

    def _drafting(self, drafting: list[Request]) -> Drafting:
        """The two choices of each drafting row (:class:`~.choice_matrices.Drafting`)."""
        value, now, later = [], [], []
        steps = []
        for req in drafting:
            tokens, verify_tokens, draft_steps = draft_value(req, self._prior)
            value.append((tokens, 1.0))
            now.append((fixed_tokens(req, self.prefill_chunk), req.lead_fed()))
            later.append((verify_tokens, 0))
            steps.append((draft_steps, 1))
        D = len(drafting)
        shape = (D, 2)
        return Drafting(
            np.array(value, dtype=float).reshape(shape),
            np.array(now, dtype=np.int64).reshape(shape),
            np.array(later, dtype=np.int64).reshape(shape),
            np.array(steps, dtype=np.int64).reshape(shape),
            np.array([r.state.length for r in drafting], dtype=np.int64),
            sum(prompt_tail(r) for r in drafting),
        )

    # ------------------------------------------------------------------ the plans, returned
    def _ar_only(self, req: Request) -> None:
        plan = ar_only_plan(req)
        self._rows.append(RowPlan(req, plan, ar_only=True, trace=self._record(req, plan, None)))

    def _apply(self, planned: list[Request], plans: list[Plan | None], predicted_ms: float) -> None:
        """The planned rows' plans, returned to the step (:meth:`plan`)."""
        self.stats.steps += 1
        self.stats.predicted_ms += predicted_ms
        for req, plan in zip(planned, plans, strict=True):
            trace = None if plan is None else self._record(req, plan, predicted_ms)
            self._rows.append(RowPlan(req, plan, trace=trace))
        for rec in self._traced:
            if rec["predicted_ms"] is None:  # AR-only steps chosen before the step's shape was known
                rec["predicted_ms"] = round(predicted_ms, 4)

    def _record(self, req: Request, plan: Plan, predicted_ms: float | None) -> dict[str, Any] | None:
        """Count ``plan``; its record for the row's trace where the row is traced (the step attaches
        it; its measured ms come at the next step)."""
        st = self.stats
        st.rows += 1
        st.modes[plan.mode.value] += 1
        st.k_sum += plan.k
        rec = None
        if req.tracer.steps is not None:
            rec = {"mode": plan.mode.value, "k": plan.k, "positions": plan.positions,
                   "expected": round(plan.expected, 3),
                   "predicted_ms": None if predicted_ms is None else round(predicted_ms, 4),
                   "measured_ms": None}  # fmt: skip
            self._traced.append(rec)
        return rec

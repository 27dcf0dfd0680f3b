"""A step's plans: what the step planner returns (:class:`StepPlan`, a :class:`RowPlan` per planned row),
and their application to the rows. The planner reads the rows and writes none of them; the step applies
its plans before the layouts of the step's forward are built, the one writer of a planned row's pending
verification and of the AR-only step that replaces a draft forward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..draft_step import DraftStep, Plan, SlotDrafts, VerifyMode
from ..request import Action, Request
from .fusion import plan_groups


@dataclass
class RowPlan:
    """One row's plan: ``plan`` its verification (``None``: the token budget defers the row, whose pending
    verification keeps its routed span), or with ``ar_only`` an AR-only step in place of its draft
    forward; ``trace`` the record for the row's trace (tracing rows only; the planner fills in the
    measured time when it is known)."""

    req: Request
    plan: Plan | None
    ar_only: bool = False
    trace: dict[str, Any] | None = None


@dataclass
class StepPlan:
    """The planner's output for one step: ``rows`` in the order chosen, ``deferred`` the ids
    (``id(req)``) of rows the token budget moves to a later step, ``traces`` the rows' trace records
    (each with the step's predicted ms; the engine adds the measured forward's, :meth:`measured`)."""

    rows: list[RowPlan] = field(default_factory=list)
    deferred: set[int] = field(default_factory=set)
    traces: list[dict[str, Any]] = field(default_factory=list)

    def measured(self, forward_seconds: float) -> None:
        """The step's forward took ``forward_seconds``: into its trace records."""
        for rec in self.traces:
            rec["measured_ms"] = round(1e3 * forward_seconds, 4)


def apply_plans(plans: StepPlan) -> None:
    """Apply each row's plan (see the module docstring)."""
    for rp in plans.rows:
        req = rp.req
        if rp.ar_only:
            to_ar_only(req, rp.plan)
        else:
            _verify_as_planned(req, rp.plan)
        if rp.trace is not None and req.tracer.steps:
            req.tracer.steps[-1].plan = rp.trace


def _verify_as_planned(req: Request, plan: Plan | None) -> None:
    """The row's pending verification as ``plan`` chose it (``None``: deferred, its routed span)."""
    p = req.pending
    if plan is None:
        if p.plan is not None:
            p.span_len = p.plan.full_span
        return
    p.plan, p.span_len, p.mode = plan, plan.k, plan.mode
    p.groups = plan_groups(req, p, positions=plan.positions) if plan.mode == VerifyMode.FUSED else []


def to_ar_only(req: Request, plan: Plan) -> None:
    """Turn ``req``'s draft into an AR-only step: its pending verification of the first masked slot, or,
    where committed tokens are not cached yet, the lead alone (:attr:`~.request.Action.LEAD`)
    (:mod:`~..planner.draft_or_ar`)."""
    cur = req.cursor
    req.stats.steps += 1
    req.stats.ar_only_steps += 1
    req.tracer.begin_step(cur.start, cur.step)
    if req.commits_pending():
        req.action = Action.LEAD
        return
    slot, mask_id = cur.candidates[0], req.info.mask_token_id
    p = DraftStep(SlotDrafts([slot], [mask_id], [0.0], alpha=[0.0]), [False], 1, mode=VerifyMode.AR_ONLY)
    p.span_len, p.filled, p.plan = 1, list(cur.ids), plan
    req.pending, req.action = p, Action.VERIFY

"""What the step planner returns: a plan per planned row, which the step applies (:mod:`.step.plans`).

The planner reads the rows and writes none of them; the step applies its plans before the layouts of the
step's forward are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .draft_step import Plan
from .request import Request


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

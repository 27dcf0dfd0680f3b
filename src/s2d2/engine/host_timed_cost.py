"""A step-cost profile plus the engine's host time per row: what the step planner decides with.

A measured profile (:class:`~.cost.FittedCost`) predicts the forward. On the host that runs it, a step
also spends time outside the forward (the device half's small ops, the host bookkeeping, admission and
retirement), most of it per row: on this project's CPU about a quarter of a step at 16 rows. A choice
that takes more steps for the same tokens (AR only) pays that time per token more often than a draft,
so the planner charges it: :class:`HostTimedCost` adds ``host_ms_per_row x rows`` to every prediction,
with ``host_ms_per_row`` learned from the engine's measured steps (:meth:`observe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost import StepCost, StepShape

#: Weight of the newest step in the running estimate of host milliseconds per row.
HOST_EMA = 0.1


@dataclass
class HostTimedCost:
    """``inner``'s prediction plus ``host_ms_per_row`` per row (a :class:`~.cost.StepCost`)."""

    inner: StepCost
    host_ms_per_row: float = 0.0
    observed: int = 0

    def predict_ms(self, shape: StepShape) -> float:
        return self.inner.predict_ms(shape) + self.host_ms_per_row * shape.rows

    def predict_totals(self, rows: int, tokens: int, attention: float, kv: int, padded: float) -> float:
        return self.inner.predict_totals(rows, tokens, attention, kv, padded) + self.host_ms_per_row * rows

    def observe(self, other_ms: float, rows: int) -> None:
        """One engine step's measured milliseconds outside the forward, over its ``rows`` rows."""
        if rows < 1 or other_ms < 0:
            return
        per_row = other_ms / rows
        w = 1.0 if self.observed == 0 else HOST_EMA
        self.host_ms_per_row += w * (per_row - self.host_ms_per_row)
        self.observed += 1

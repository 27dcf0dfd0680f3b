"""A step-cost profile plus the engine's host time per row: what the step planner decides with.

A measured profile (:class:`~.cost.FittedCost`) predicts the forward. On the host that runs it, a step
also spends time outside the forward (the device half's small ops, the host bookkeeping, admission and
retirement), most of it per row. A choice that takes more steps for the same tokens (AR only) pays that
time per token more often than a draft, so the planner charges it: :class:`HostTimedCost` adds
``host_ms_per_step + host_ms_per_row x rows`` to every prediction, and prices an AR step with its own
figure a row (:meth:`HostTimedCost.for_ar`: an AR row's step registers no draft or verification, and
costs less host time). The figures are constants of the engine (:data:`~.generic.HOST_MS_PER_STEP`,
:data:`~.generic.HOST_MS_PER_ROW`, :data:`~.generic.HOST_MS_PER_AR_ROW`), not learned from the run's wall
time: the plans, and so the statistics, stay the same from run to run. Both terms matter to
the admission choice (:mod:`s2d2.engine.planner.cycle`): a step's host time measured on this engine is
mostly fixed at a few rows and grows by much less than the fixed figure per row at many rows, and
charging all of it per row overprices every step at a high load, which favours the choices that take
fewer steps (bigger blocks) there.
"""

from __future__ import annotations

from dataclasses import dataclass

from .step_cost import StepCost, StepShape


@dataclass(frozen=True)
class HostTimedCost:
    """``inner``'s prediction plus ``host_ms_per_step`` and ``host_ms_per_row`` per row (a
    :class:`~.cost.StepCost`)."""

    inner: StepCost
    host_ms_per_row: float
    host_ms_per_step: float = 0.0
    #: the host milliseconds a row of an AR step costs, where it differs from ``host_ms_per_row`` (an
    #: AR row's step has no draft or verification to register: the engine's AR lane)
    ar_host_ms_per_row: float | None = None

    def host_ms(self, rows: int) -> float:
        """The host milliseconds charged to a step of ``rows`` rows."""
        return self.host_ms_per_step + self.host_ms_per_row * rows

    def for_ar(self) -> HostTimedCost:
        """The same profile with an AR step's host time a row (itself where none is given)."""
        if self.ar_host_ms_per_row is None:
            return self
        return HostTimedCost(self.inner, self.ar_host_ms_per_row, self.host_ms_per_step)

    def predict_ms(self, shape: StepShape) -> float:
        return self.inner.predict_ms(shape) + self.host_ms(shape.rows)

    def predict_totals(self, rows: int, tokens: int, attention: float, kv: int, padded: float) -> float:
        return self.inner.predict_totals(rows, tokens, attention, kv, padded) + self.host_ms(rows)

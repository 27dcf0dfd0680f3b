"""The decode trace as a side channel: an object the step reports to, not checks scattered in it.

A request carries a :class:`Tracer`. :class:`NullTracer` (the default) ignores everything;
:class:`StepTracer` records one :class:`~s2d2.decoding.stats.StepTrace` per decoding step.
"""

from __future__ import annotations

from ..decoding.stats import StepTrace


def _num(x: object) -> float | None:
    """A float (or None) from a float or a 0-d tensor, rounded for the record."""
    return None if x is None else round(float(x), 6)


class Tracer:
    """What the decode step reports: a new step, each committed token, a verification. Records them while
    :attr:`steps` is a list (:class:`StepTracer`); with ``steps`` None (:class:`NullTracer`) every report
    is ignored."""

    steps: list[StepTrace] | None = None

    def begin_step(self, block_start: int, step: int, *, predrafted: bool = False) -> None:
        """A step of the block at ``block_start`` starts (its draft forward came back, or, ``predrafted``,
        its drafts came from the previous fused verification)."""
        if self.steps is not None:
            self.steps.append(StepTrace(block_start=block_start, step=step, predrafted=predrafted))

    def commit(
        self,
        position: int,
        token: int,
        how: str,
        *,
        confidence: float | None = None,
        q_prob: float | None = None,
    ) -> None:
        """``token`` was committed at absolute ``position``; ``how`` in ar | accepted | resampled |
        fallback | baseline | edited. ``confidence``: the drafter's probability of the token; ``q_prob``: the
        verifier's (when the step has them); floats or 0-d tensors (read only when recording)."""
        if self.steps:
            self.steps[-1].commits.append((position, token, how))
            self.steps[-1].probs.append((_num(confidence), _num(q_prob)))

    def verified(self, span: int, accepted: int) -> None:
        """This step verified ``span`` drafts and accepted ``accepted`` of them."""
        if self.steps:
            rec = self.steps[-1]
            rec.verified, rec.span, rec.accepted = True, span, accepted


class NullTracer(Tracer):
    """Records nothing."""


class StepTracer(Tracer):
    """Records every step."""

    def __init__(self) -> None:
        self.steps: list[StepTrace] = []

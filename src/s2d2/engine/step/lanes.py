"""The step's lanes: rows whose common steps skip the general step's per-row objects.

A row's lane is decided once, at admission (:func:`lane_of`): the AR lane (:mod:`.ar_lane`, block size 1
greedy rows) or the lossless lane (:mod:`.lossless_lane`, greedy strict ``always`` rows). Each step,
:class:`Lanes` takes the rows whose step is their lane's common one, gives the device half their
batched queries, and applies the results; where the step's batched queries fail it hands them back to
the general step (:meth:`Lanes.as_rows`). ``LLMEngine.lanes = False`` puts every row on the general step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..request import Request
from ..row_forward import RowForward
from .ar_lane import Lane, lane_eligible
from .device import DeviceOps
from .device_math import BatchedCheck
from .lossless_lane import LosslessLane, lossless_eligible
from .row_queries import RowWork


def lane_of(req: Request) -> str | None:
    """The lane ``req``'s settings put its common steps in: "ar", "lossless" or None (decided once, at
    admission; structured output takes the general step)."""
    if req.grammar is not None:
        return None
    if lane_eligible(req):
        return "ar"
    return "lossless" if lossless_eligible(req) else None


class Lanes:
    """The lanes' rows of one step."""

    def __init__(self, summary: bool = False) -> None:
        """``summary``: the rows' logits are summaries (:mod:`.summary_step`)."""
        self.ar = Lane(summary)
        self.lossless = LosslessLane(summary)

    def take(self, req: Request, logits: torch.Tensor, forward: RowForward) -> bool:
        """Take ``req`` into its lane if this step of it is the lane's."""
        if req.lane == "ar":
            return self.ar.take(req, logits, forward)
        return req.lane == "lossless" and self.lossless.take(req, logits, forward)

    def checks(self, dev: DeviceOps) -> list[BatchedCheck]:
        """The lanes' batched device work (:mod:`.lane_math`: drafts and strict verifications)."""
        return [*self.ar.checks(dev), *self.lossless.checks(dev)]

    def apply(self, fail: Callable[[Request, BaseException], None]) -> None:
        """Every lane row's step from its filled results (an error fails its row alone)."""
        self.ar.apply(fail)
        self.lossless.apply(fail)

    def as_rows(self, dev: DeviceOps, fail: Callable[[Request, BaseException], None]) -> list[RowWork]:
        """The lanes' rows handed back to the general step, the lanes emptied."""
        return self.ar.as_rows(dev, fail) + self.lossless.as_rows(dev, fail)

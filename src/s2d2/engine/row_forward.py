"""One row's part of a step's forward, as the runner built it: what the step needs after the forward.

Building a row's part of the batch writes nothing to the row (:meth:`~.runner.ModelRunner.layout`):
what the step must know after the forward rides here instead, and the step applies it once
(:func:`~.step.apply`): the positions the forward keeps (the cached length grows by them), the block's
committed slots it caches, and the slot whose AR-mode prediction it carries.
"""

from __future__ import annotations

from typing import NamedTuple

from ..forward.segment import Segment


class RowForward(NamedTuple):
    """``segment``: what the row feeds to the forward (its ``keep`` new positions stay cached);
    ``lead``: the block slot whose AR-mode prediction the forward also carries (``plan=auto`` rows: the
    first candidate), or None; ``extension``: committed slots of the open block the forward caches
    beyond its pending tokens (a draft or lead forward of a partly cached block). Immutable (a named
    tuple: one is made per row per step)."""

    segment: Segment
    lead: int | None = None
    extension: int = 0
    #: the AR lane's steady draft (:func:`~.step.lanes.steady`), decided as the part was built
    steady: bool = False

    @property
    def n(self) -> int:
        """Query tokens the row feeds."""
        return self.segment.n

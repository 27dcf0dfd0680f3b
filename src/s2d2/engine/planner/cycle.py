"""The cycle model: what each way of decoding a lossless request costs per committed token at a load.

Every way commits AR greedy's tokens, so the choice changes speed only. The ways priced here:

- **AR** (block size 1 in the prices): one committed token a row a step, a step of 2 query tokens a row.
- **plain lossless at block size B**: a block is decoded in *cycles*, a draft forward of its ``m``
  uncommitted slots and a whole-span verification (``2m`` query tokens), which commits the accepted
  prefix and the first correction. With an acceptance ``a`` per position (independent), the expected
  cost of a block follows from a chain over the slots left (:func:`block_ms`): ``m`` falls by
  ``min(k + 1, m)`` a cycle, ``k`` the accepted prefix (``P(k >= j) = a**j``). Rows of a batch fall out
  of step, so a step of the cycle is priced as half its rows drafting and half verifying: two forwards
  of ``1.5 m`` query tokens a row.
- **planned step by step at block size B** (:func:`fused_block_ms`): what planning buys over plain
  verification is mostly fusion, the next draft carried by the verification (one forward a cycle, of
  ``2m`` plus its pre-draft groups), at the host cost of those groups a row.

The acceptance falls with the block size (more slots drafted at once, and a block's slots past a stop
token drafted for nothing): :func:`acceptance` fits the built-in model's plain lossless decoding at each
of B4, B8 and B16 (committed tokens a cycle; BENCHMARKS.md, "The default at every load").
The prices are the planner's (its profile, with the host time a step and a row where that profile was
measured on this host), at the load and the half-way context the request will decode under.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

from ...cost.host_timed import HostTimedCost
from ...cost.step_cost import StepCost
from .block_size import forward_ms

#: Acceptance per position of a plain lossless draft by block size: each solves the chain for the built-in
#: model's committed tokens a cycle at that size (3.31 / 4.46 / 5.07 at B4 / B8 / B16, one row, 64 test
#: problems); other sizes are interpolated in log2 of the size (extrapolated with the nearest segment).
#: A single line through all three (0.931 - 0.0375 log2(B / 4)) put B8 at 0.894, 4.58 tokens a cycle:
#: 2.7% more than measured, enough to rank B8 above B4 where the two are measured within a few percent.
ACCEPTANCE = {4: 0.931, 8: 0.887, 16: 0.856}
#: How much cheaper (relative) per committed token another choice must be priced than the one the engine
#: made last for the same candidates before it replaces it: within that, two choices price within the
#: profiles' noise, and the choice stays (no flapping from request to request).
MARGIN = 0.03
#: How much cheaper the planned (fused) cycle must be priced than the best plain choice: planning also
#: spends host time the cycle leaves out (the planning itself, the acceptance estimates, the lead).
PLAN_MARGIN = 0.15
#: Pre-draft groups a fused verification carries, at most (each of ``predraft_positions`` slots).
FUSED_GROUPS = 4
#: The candidate that stands for AR in the prices.
AR = 1


def acceptance(block_size: int) -> float:
    """The assumed acceptance per position of a plain lossless draft of ``block_size`` slots
    (:data:`ACCEPTANCE`, interpolated in log2 of the size between its two nearest entries)."""
    points = sorted((math.log2(b), a) for b, a in ACCEPTANCE.items())
    x = math.log2(max(block_size, 1))
    i = 1
    while i < len(points) - 1 and x > points[i][0]:
        i += 1
    (x0, a0), (x1, a1) = points[i - 1], points[i]
    a = a0 + (a1 - a0) * (x - x0) / (x1 - x0)
    return min(0.99, max(0.05, a))


def _chain(block_size: int, a: float, cycle_ms: Callable[[int], float]) -> float:
    """Expected total of ``cycle_ms(m)`` over the cycles of a block of ``block_size`` slots."""

    @cache
    def left(m: int) -> float:
        if m <= 0:
            return 0.0
        total = cycle_ms(m)
        for j in range(1, m + 1):  # j slots committed: j - 1 accepted then a correction, or all m
            p = a ** (j - 1) * (1 - a) if j < m else a ** (m - 1)
            total += p * left(m - j)
        return total

    return left(block_size)


def block_ms(price: Callable[[float], float], block_size: int, a: float) -> float:
    """Expected ms of a plain lossless block: two forwards a cycle of ``1.5 m`` query tokens a row each,
    ``price(q)`` the ms of a forward of every row feeding ``q``."""
    return _chain(block_size, a, lambda m: 2.0 * price(1.5 * m))


def fused_block_ms(
    price: Callable[[float], float], block_size: int, a: float, predraft: int, group_ms: float
) -> float:
    """Expected ms of a fused block: its first draft, then one forward a cycle (the verification of
    ``2m`` and :data:`FUSED_GROUPS` pre-draft groups of ``predraft`` slots), plus ``group_ms`` of host
    time a fused forward."""
    extra = FUSED_GROUPS * predraft
    return price(block_size) + _chain(block_size, a, lambda m: price(2 * m + extra) + group_ms)


def prices(cost: StepCost, rows: int, sizes: Sequence[int], context: int) -> dict[int, float]:
    """Predicted ms per committed token of a row, at ``rows`` rows alike with ``context`` cached
    positions: AR (key :data:`AR`; with this host's time, an AR step's, :meth:`HostTimedCost.for_ar`)
    and plain lossless at each of ``sizes``."""
    rows, context = max(1, rows), max(0, context)

    def price(q: float) -> float:
        return forward_ms(cost, rows, q, context)

    ar_cost = cost.for_ar() if isinstance(cost, HostTimedCost) else cost
    out = {AR: forward_ms(ar_cost, rows, 2, context) / rows}
    for b in sizes:
        out[b] = block_ms(price, b, acceptance(b)) / (b * rows)
    return out


def planned_price(
    cost: StepCost, rows: int, block_size: int, context: int, predraft: int, host_ms_per_group: float
) -> float:
    """Predicted ms per committed token of a row planned step by step (priced as fused) at ``block_size``."""
    rows, context = max(1, rows), max(0, context)

    def price(q: float) -> float:
        return forward_ms(cost, rows, q, context)

    a = acceptance(block_size)
    return fused_block_ms(price, block_size, a, predraft, host_ms_per_group * rows) / (block_size * rows)


@dataclass
class CycleChoice:
    """The choice among AR and plain block sizes, with hysteresis: the engine's last choice for the same
    candidates stays while it is priced within :data:`MARGIN` of the cheapest."""

    margin: float = MARGIN
    _last: dict[tuple[int, ...], int] = field(default_factory=dict)

    def choose(self, priced: dict[int, float]) -> int:
        """The candidate (:data:`AR` or a block size) to decode with, among ``priced`` (ms a token)."""
        key = tuple(sorted(priced))
        best = min(priced, key=lambda c: (priced[c], c))
        last = self._last.get(key)
        if last is not None and priced[last] <= (1.0 + self.margin) * priced[best]:
            best = last
        self._last[key] = best
        return best

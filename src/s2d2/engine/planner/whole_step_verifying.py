"""The step planner's whole-step check of its verifying rows' picks, for a profile with a ridge.

Each verifying row's choice (:func:`~.choice_matrices.row_costs`) is priced at the marginal ms per query
token of the step's shape with every span verified plainly. Below a roofline's ridge that marginal cost
is about zero (the step is bound by reading the weights), so every row's pre-draft groups look free and
every row takes them, and the step that results is compute-bound: at 8 rows of an SDAR-8B-shaped model
on the H200, lossless-auto at B16 fused 810 of 2,311 planned verifications and ran 1.25x the ms per step
of plain B16 for fewer tokens per step. Here the picks that differ from plain verification are taken in
the order of their per-row gain, and the step is priced exactly (the profile's prediction of its shape,
plus each taken pick's cost beyond its query tokens: later verifications, group host time, the draft
forwards its groups save) with the first ``k`` of them for ``k`` in 0, 1, 2, 4, ... and all; the
cheapest is kept. Every choice commits the span's expected tokens (now or at the row's next
verification), so the cheapest step is the best ratio of tokens to ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...cost.step_cost import StepCost
from .choice_matrices import predict

#: one choice of :func:`~.choice_matrices.row_costs`: (cost ms, column, query tokens, expected tokens now)
Choice = tuple[float, int, int, float]


def whole_step(
    cost: StepCost,
    picks: Sequence[Choice],
    plain: Sequence[Choice],
    tokens: np.ndarray,
    contexts: np.ndarray,
    m: float,
) -> list[Choice]:
    """Each verifying row's choice after the whole-step check (see the module docstring).

    ``picks`` / ``plain`` ``[spans]``: each row's own pick and its plain verification, priced at marginal
    ms ``m`` per query token; ``tokens`` / ``contexts`` ``[rows]``: the step's shape with every span
    plain (the spans first, then the step's other rows)."""
    upgrades = [i for i, (p, q) in enumerate(zip(picks, plain, strict=True)) if p[1] != q[1]]
    if not upgrades:
        return list(picks)
    upgrades.sort(key=lambda i: picks[i][0] - plain[i][0])  # the largest gain first
    n = len(upgrades)
    counts = sorted({0, n} | {1 << j for j in range(n.bit_length()) if 1 << j < n})
    best_k, best_total = 0, float("inf")
    for k in counts:
        toks = tokens.copy()
        rest = 0.0
        for i in upgrades[:k]:
            toks[i] = picks[i][2]
            rest += picks[i][0] - m * picks[i][2]
        total = predict(cost, toks, contexts) + rest
        if total < best_total:
            best_k, best_total = k, total
    taken = set(upgrades[:best_k])
    return [p if i in taken or p[1] == q[1] else q for i, (p, q) in enumerate(zip(picks, plain, strict=True))]

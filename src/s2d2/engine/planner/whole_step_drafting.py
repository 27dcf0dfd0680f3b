"""The step planner's whole-step check of its rows about to draft: the per-row picks against every row
drafting and every row AR only, each priced at its own shape.

Each row's own choice (:func:`~.draft_or_ar.prefers_ar`) linearises the cost profile at one shape, with
every row drafting. A profile with a ridge (a roofline's compute and memory bounds) is not linear across
the two: a step of drafts can be compute-bound where the same rows AR only are memory-bound and a draft
costs little more than AR. So the planner also prices the step with every drafting row drafting and with
every one AR only, and keeps the best of the three by the ratio below.

Ratio: the step's expected committed tokens over its predicted ms (its prompt tokens left out at the
marginal ms: they commit nothing whatever is chosen), plus the drafts' later verifications and the
draft forwards that the step's verifying rows' drafts took (their tokens at the marginal ms and a fixed
share each): counted as a draft's cost is, so that drafts made earlier do not make the step look
cheaper per token than decoding is (they would favour whichever choice costs less now).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...cost.step_cost import StepCost
from .choice_matrices import point


@dataclass
class DraftingChoice:
    """A step's shape with every drafting row drafting: ``tokens`` / ``contexts`` ``[rows]`` (verifying
    rows at plain verification); ``at``: each drafting row's index in them; ``ar_tokens``: its query
    tokens as AR only; ``values``: its draft's (expected tokens, later verification tokens, row-steps),
    :func:`~.draft_or_ar.draft_value`; ``fixed_value``: the other rows' expected tokens; ``sunk``: the
    prompt tokens the step carries; ``earlier``: each verifying row's draft forward tokens."""

    tokens: np.ndarray
    contexts: np.ndarray
    at: Sequence[int]
    ar_tokens: Sequence[int]
    values: Sequence[tuple[float, int, int]]
    fixed_value: float
    sunk: int
    earlier: Sequence[int]

    def ratio(self, cost: StepCost, ar: Sequence[bool]) -> float:
        """Expected tokens per effective ms of the step with drafting rows AR only where ``ar`` says."""
        toks = self.tokens.copy()
        for i, t, a in zip(self.at, self.ar_tokens, ar, strict=True):
            if a:
                toks[i] = t
        ms, m, share = point(cost, toks, self.contexts)
        value, later = self.fixed_value, 0.0
        for (tokens, verify, steps), a in zip(self.values, ar, strict=True):
            if a:
                value += 1.0
            else:
                value += tokens
                later += m * verify + share * (steps - 1)
        earlier = m * sum(self.earlier) + share * len(self.earlier)
        return value / max(ms - m * self.sunk + later + earlier, 1e-9)

    def best(self, cost: StepCost, picks: list[bool], all_ar: bool) -> list[bool]:
        """The best of ``picks``, every row drafting and (``all_ar``) every row AR only; ``picks`` where
        none is better."""
        n = len(picks)
        options = [picks, [False] * n] + ([[True] * n] if all_ar else [])
        ratios = [self.ratio(cost, o) if i == 0 or o != picks else -1.0 for i, o in enumerate(options)]
        return options[int(np.argmax(ratios))]

"""The step's query-token budget (``max_num_batched_tokens``, as vLLM's): the planner keeps each step
within it by degrading planned verifications to their smallest choice (AR only: least expected tokens
lost per saved query token first), then deferring prefill chunks, then other rows (last in the running
order first) to a later step; one row always runs (the engine refuses a budget below one row's most).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..request import Action, Request
from .choice_matrices import Choices, Fixed


def fit_budget(
    budget: int,
    planned: list[Request],
    others: list[Request],
    ch: Choices,
    picks: Any,
    fixed: Fixed,
    stats: Any,
) -> tuple[Any, set[int]]:
    """``(picks, deferred ids)`` within ``budget`` (see the module docstring); ``picks`` a column per
    planned row of ``ch``, ``fixed`` the query tokens of ``others``; counts go to ``stats``."""
    rix = np.arange(len(planned))
    tok = ch.tokens[rix, picks].copy() if planned else np.zeros(0, dtype=np.int64)
    total = int(tok.sum()) + int(fixed.tokens.sum())
    if total <= budget:
        return picks, set()
    stats.over_budget_steps += 1
    if planned:
        small = np.argmin(np.where(ch.valid, ch.tokens, 1 << 30), axis=1)
        saved = tok - ch.tokens[rix, small]
        lost = ch.expected[rix, picks] - ch.expected[rix, small]
        picks = picks.copy()
        for i in np.argsort(np.where(saved > 0, lost / np.maximum(saved, 1), np.inf), kind="stable"):
            if total <= budget or saved[i] <= 0:
                break
            picks[i], total = small[i], total - int(saved[i])
            tok[i] = ch.tokens[i, small[i]]
            stats.degraded += 1
    sizes = {id(r): int(t) for r, t in zip(planned, tok, strict=True)}
    sizes |= {id(r): int(t) for r, t in zip(others, fixed.tokens, strict=True)}
    rows = planned + others
    order = [r for r in reversed(rows) if r.action == Action.PREFILL]
    order += [r for r in reversed(rows) if r.action != Action.PREFILL]
    deferred: set[int] = set()
    for r in order:
        if total <= budget or len(deferred) == len(rows) - 1:
            break
        deferred.add(id(r))
        total -= sizes[id(r)]
    stats.deferred += len(deferred)
    return picks, deferred

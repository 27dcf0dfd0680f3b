"""The block size a request of the lossless family decodes with, chosen by load when it is added.

With ``plan="auto"`` and ``plan_block_sizes`` (:meth:`~s2d2.config.DecodeConfig.block_size_choices`),
every candidate block size commits the same tokens (AR greedy's), so the choice changes speed only.
A bigger block drafts more positions a forward and verifies longer spans; that pays while a forward's
cost hardly depends on its query tokens (a GPU at low load reads the weights once whatever it feeds),
and not where every query token costs (a CPU, or a GPU past its compute ridge at high load). So the
choice prices, at the load the request will decode under, the two forwards a block size shapes: its
draft (``B + 1`` query tokens a row, with the AR lead) and the verification of a whole block (``2B + 1``),
each for every row of the step, and keeps the largest size whose two prices are within
:data:`TOLERANCE` of the smallest candidate's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...config import DecodeConfig
from ...cost.step_cost import StepCost

#: How much dearer (relative) a bigger block's forwards may be priced than the smallest's and still be
#: chosen: "about free", within what the profiles resolve.
TOLERANCE = 0.03


def forward_ms(cost: StepCost, rows: int, query_tokens: float, context: int) -> float:
    """Predicted ms of one forward of ``rows`` rows alike, each feeding ``query_tokens`` query tokens
    after ``context`` cached positions (every query sees the cache and its row's queries)."""
    tokens = rows * query_tokens
    attention = tokens * (context + query_tokens)
    return cost.predict_totals(rows, tokens, attention, rows * context, attention)


def halfway_context(n_prompt: int, config: DecodeConfig) -> int:
    """The cached positions a row of ``n_prompt`` prompt tokens holds about half-way through its
    decoding: where the choices made when it is added price its forwards."""
    return n_prompt + config.max_new_tokens // 2


def choose_block_size(cost: StepCost, sizes: Sequence[int], rows: int, context: int) -> int:
    """The largest of ``sizes`` whose draft and whole-block verification forwards, at ``rows`` rows with
    ``context`` cached positions each, are priced within :data:`TOLERANCE` of the smallest size's."""
    if not sizes:
        raise ValueError("no block size to choose from")
    rows, context = max(1, rows), max(0, context)
    prices = {
        b: (forward_ms(cost, rows, b + 1, context), forward_ms(cost, rows, 2 * b + 1, context)) for b in sizes
    }
    draft0, verify0 = prices[min(sizes)]
    limit = 1.0 + TOLERANCE
    return max(
        b for b, (draft, verify) in prices.items() if draft <= limit * draft0 and verify <= limit * verify0
    )


def planned_config(
    config: DecodeConfig,
    sizes: Sequence[int],
    n_prompt: int,
    rows: int,
    cost: StepCost,
    fits: Callable[[DecodeConfig], bool],
) -> DecodeConfig:
    """``config`` with the block size chosen among ``sizes`` (its
    :meth:`~s2d2.config.DecodeConfig.block_size_choices`) for a request of ``n_prompt`` prompt tokens that
    will share steps with ``rows`` rows in all; a size whose settings do not ``fit`` the engine's limits
    gives way to the next smaller choice (and none is chosen when ``block_size``'s own settings do not
    fit: their error stands). Settings are rebuilt only for a size other than ``block_size`` (a request's
    usual case costs no validation)."""
    sizes = list(sizes)
    context = halfway_context(n_prompt, config)
    while len(sizes) > 1:
        b = choose_block_size(cost, sizes, rows, context)
        if b == config.block_size or not fits(config):
            return config
        chosen = config.replace(block_size=b)
        if fits(chosen):
            return chosen
        sizes = [s for s in sizes if s < b]
    return config

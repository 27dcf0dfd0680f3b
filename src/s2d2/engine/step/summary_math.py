"""The device half's values read off the rows' summaries (:mod:`~s2d2.forward.vocab_summary`) instead of
their logits: what :func:`~.draft_math.draft_group` computes from full rows for a greedy query with no
sampling filters, from the ``[S, WIDTH]`` summaries of the same rows (the same functions of the same
distributions, up to float32 rounding)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...forward.vocab_summary import ENTROPY, MARGIN, PROB, SQUARES, TOKEN


def tokens(rows: torch.Tensor) -> torch.Tensor:
    """The greedy token of each summary row ``[S, WIDTH]``: ``[S]`` int64."""
    return rows[:, TOKEN].long()


def acceptance(name: str, rows: torch.Tensor, vocab: int, param: float | None) -> torch.Tensor:
    """:func:`~s2d2.decoding.functional.acceptance_estimate` ``name`` of the greedy drafts, from their
    summaries ``[S, WIDTH]`` (``vocab``: the distribution's width, for the normalised entropy): ``[S]``."""
    if name == "hard-margin":
        return (rows[:, MARGIN] > param).float()
    if name == "hard-entropy":
        return (rows[:, ENTROPY] / math.log(vocab) < param).float()
    if name == "confidence-power":
        return rows[:, PROB].pow(param)
    if name == "clipped-margin":
        return (param * rows[:, MARGIN]).clamp(0.0, 1.0)
    if name == "soft-entropy":
        return torch.exp(-param * rows[:, ENTROPY] / math.log(vocab))
    if name == "renyi2":
        return rows[:, SQUARES].clone()
    raise ValueError(f"unknown estimator {name!r}")


def greedy_values(
    rows: torch.Tensor, vocab: int, entropy: bool, norm_entropy: bool, estimators: Sequence[tuple]
) -> dict[str, torch.Tensor]:
    """A draft group's device values by key (``drafts``, ``conf``, and as asked ``entropy``,
    ``norm_entropy``, ``alpha:(name, param)``) from the summaries ``rows`` ``[S, WIDTH]`` of its greedy
    queries' slots."""
    out = {"drafts": tokens(rows), "conf": rows[:, PROB].clone()}
    if entropy:
        out["entropy"] = rows[:, ENTROPY].clone()
    if norm_entropy:
        out["norm_entropy"] = rows[:, ENTROPY] / math.log(vocab)
    for est in estimators:
        out[f"alpha:{est}"] = acceptance(est[0], rows, vocab, est[1])
    return out

"""A query's logits rows after the request's grammar mask and logit adjustments (:func:`adjusted`)."""

from __future__ import annotations

from typing import Protocol

import torch

from ...constraints.bitmask import masked_rows
from ...decoding.logits_adjust import adjust_logits, token_counts
from ..request import Request
from .device import DeviceOps


class AdjustedQuery(Protocol):
    """What :func:`adjusted` reads of a draft or verify query: its row, and where its logits sit."""

    req: Request
    positions: list[int] | None
    context: list[int] | None
    grammar_dev: torch.Tensor | None


def adjusted(dev: DeviceOps, q: AdjustedQuery, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` after the request's grammar mask (structured output: forbidden tokens at -inf) and its
    logit adjustments (:mod:`~s2d2.decoding.logits_adjust`): bias, penalties counted over the generated
    tokens before each row's position, ``min_tokens``. A row the adjustments leave with no token the
    grammar allows (a bias of -100 on each, ``min_tokens`` holding back the one stop token the grammar
    allows) keeps its grammar-masked logits unadjusted: a constrained row always has a token to take."""
    if q.grammar_dev is not None:
        rows = masked_rows(rows, q.grammar_dev)
    if q.positions is None:
        return rows
    req, adjust = q.req, q.req.adjust
    before = [p - req.n_prompt for p in q.positions]
    counts = None
    if adjust.needs_counts:
        n, T = len(before), len(q.context)
        tokens = dev.tensor(q.context).expand(n, T)
        reach = dev.arange(T).view(1, T) < dev.tensor(before).view(n, 1)
        counts = token_counts(tokens, reach & (tokens != req.info.mask_token_id), rows.shape[-1])
    out = adjust_logits(rows, adjust, counts, dev.tensor(before))
    if q.grammar_dev is None:
        return out
    emptied = torch.isneginf(out).all(dim=-1, keepdim=True) & ~torch.isneginf(rows).all(dim=-1, keepdim=True)
    return torch.where(emptied, rows.to(out.dtype), out)

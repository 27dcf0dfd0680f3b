"""The forward's logits as the step's math reads them: a group's rows as one tensor (a view where they
tile the forward's output), the mask token's column removed, and the request's logit adjustments."""

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


def tiled(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor ``rows`` tile end to end, in order, when they do (views of the forward's logits that
    cover them whole: every row of a step that drafts, or verifies, alone), else None."""
    first = rows[0]
    if first.storage_offset() != 0:
        return None
    storage, at = first.untyped_storage().data_ptr(), 0
    for r in rows:
        if r.storage_offset() != at or not r.is_contiguous() or r.untyped_storage().data_ptr() != storage:
            return None
        at += r.numel()
    if at * first.element_size() != first.untyped_storage().nbytes():
        return None
    vocab = first.shape[-1]
    return first.as_strided((at // vocab, vocab), (vocab, 1), 0)


def without_mask_token(
    rows: list[torch.Tensor], mask_id: int, keep_raw: bool, in_place: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's logits ``[S, vocab]`` (``rows`` stacked) and a copy with the mask token's column at
    -inf (it is never a prediction).

    ``in_place``: no query of the step reads raw logits, so the forward's logits are masked where they
    are (no copy where the rows tile them, :func:`tiled`; the mask column is -inf for every query of
    the step alike). Otherwise the stacking is a copy already and is masked in place unless the raw
    logits are still needed (``keep_raw``: log-probabilities) or there is one part (a view of the
    forward's logits, which other queries may read)."""
    if in_place:
        masked = tiled(rows) if len(rows) > 1 else rows[0]
        if masked is None:
            masked = torch.cat(rows)
        masked[:, mask_id] = float("-inf")
        return masked, masked
    if len(rows) == 1 or keep_raw:
        logits = torch.cat(rows) if len(rows) > 1 else rows[0]
        masked = logits.clone()
    else:
        logits = masked = torch.cat(rows)
    masked[:, mask_id] = float("-inf")
    return logits, masked


def adjusted(dev: DeviceOps, q: AdjustedQuery, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` after the request's grammar mask (structured output: forbidden tokens at -inf) and its
    logit adjustments (:mod:`~s2d2.decoding.logits_adjust`): bias, penalties counted over the generated
    tokens before each row's position, ``min_tokens``."""
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
    return adjust_logits(rows, adjust, counts, dev.tensor(before))

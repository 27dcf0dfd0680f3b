"""A shifted family's layouts (Fast-dLLM v2: the hidden state at position ``p`` scores the token at
``p + 1``): the same-position layouts with their logit rows re-aligned to block slots by an index map
(:class:`~.layout.Realign`), read by the ``shifted`` trait of a family.

* slot ``j >= 1`` is read from the row of slot ``j - 1`` of the same forward;
* slot 0 is predicted by the last position before the block: in a draft with pending tokens the last
  pending row (one extra logit row, saved for later), otherwise the row saved by the forward that wrote
  position ``start - 1`` (a prefill, a commit or a draft's pending tokens); at position 0 none exists
  and the row is all zeros (uniform).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import specs
from .layout import Layout, Realign, Tokens, last_rows


def prefill(lay: Layout, length: int) -> Layout:
    """A prefill or commit (:func:`~.layout.prefill`) at ``length...`` that also reads its last row and
    saves it as the prediction for the first position after it; it returns no rows."""
    n = len(lay.ids)
    return lay._replace(logit_rows=last_rows(n, 1), realign=Realign((), save_row=0, save_at=length + n))


def draft(lay: Layout, m: int, start: int) -> Layout:
    """A draft (:func:`~.layout.draft`, nothing cached, no lead) of a block at ``start`` behind ``m``
    pending tokens: with pending tokens the last pending row predicts slot 0 (and is saved), else the
    saved row does."""
    n = len(lay.ids) - m
    if m:
        return lay._replace(logit_rows=last_rows(m + n, n + 1),
                            realign=Realign(tuple(range(n)), save_row=0, save_at=start))  # fmt: skip
    return lay._replace(realign=Realign((-1, *range(n - 1)), at=start))


def verify(length: int, filled: Tokens, *, start: int, slots: Sequence[int]) -> Layout:
    """A verification: a plain token-causal forward over ``filled[:max(slots)]`` (read only); slot ``s``
    is read from the row of slot ``s - 1``, slot 0 from the saved row."""
    assert length == start, "commit pending tokens (draft) before verifying"
    top = max(slots)
    rows = tuple(-1 if s == 0 else s - 1 for s in slots)
    return Layout(filled[:top], torch.arange(start, start + top), specs.causal(top), 0, last_rows(top, top),
                  realign=Realign(rows, at=start))  # fmt: skip


def score(length: int, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int) -> Layout:
    """Scoring: a plain causal forward over ``prefix`` (kept) and each branch but its last token
    (:func:`~.specs.shifted_score`); a token is scored from the row before it (the first one from the
    saved row of the position before the segment); the last prefix row is saved for the row's next
    segment."""
    start, p = length, prefix.numel()
    ids, pos, sizes = [prefix], [torch.arange(start, start + p)], [b.numel() - 1 for b in branches]
    need = list(range(score_from - 1, p - 1))  # raw rows of prefix[score_from:]; -1: the saved row
    at = p
    for b, f in zip(branches, sizes, strict=True):
        ids.append(b[:-1])
        pos.append(torch.arange(start + p, start + p + f))
        need += [p - 1] + list(range(at, at + f))
        at += f
    read = sorted({r for r in need if r >= 0} | ({p - 1} if p else set()))
    where = {r: i for i, r in enumerate(read)}
    realign = Realign(tuple(where[r] if r >= 0 else -1 for r in need), at=start,
                      save_row=where[p - 1] if p else -1, save_at=start + p)  # fmt: skip
    spec = specs.shifted_score(p, tuple(sizes))
    rows = torch.tensor(read, dtype=torch.long)
    return Layout(torch.cat(ids), torch.cat(pos), spec, p, rows, realign=realign)

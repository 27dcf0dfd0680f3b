"""What one row feeds a forward, family-independent: ids, positions, visibility, kept keys, logit rows.

A :class:`Layout` is one row's part of a batched forward, built from host integers: the visibility
among its new tokens is a :class:`~.mask_spec.MaskSpec` (:mod:`.specs`), never an ``n x n`` boolean.
Each function here lays out one kind of segment from what a family's traits say (its mask token; a
shifted family's layouts are these re-aligned, :mod:`.shifted`); the adapters wrap layouts into
:class:`~s2d2.forward.segment.Segment` objects with the row's cache state.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch

from . import specs
from .mask_spec import MaskSpec

Tokens = torch.Tensor | Sequence[int]


class Layout(NamedTuple):
    """``ids`` / ``pos``: ``[n]`` token ids and absolute positions (long tensors or int lists); ``spec``:
    what each query sees among the ``n`` new keys (and the whole cache); ``keep``: how many leading new
    keys stay cached; ``logit_rows``: the rows (into the ``n``) whose logits the caller reads;
    ``zero_rows``: all-zero logit rows the caller puts before them (a partly cached block's cached
    slots: never read); ``realign``: a shifted family's map from the raw rows to the rows returned
    (:class:`Realign`; None: the raw rows as they are); ``bias``: the visibility is added to the
    scores as 1.0/0.0 (1.0 to the cache's) and nothing is masked (LLaDA2's official prefill)."""

    ids: torch.Tensor | list[int]
    pos: torch.Tensor | list[int]
    spec: MaskSpec
    keep: int
    logit_rows: torch.Tensor
    zero_rows: int = 0
    realign: Realign | None = None
    bias: bool = False


class Realign(NamedTuple):
    """How a shifted family's raw logit rows become the rows returned, as indices: returned row ``i`` is
    raw row ``rows[i]`` (an index into ``logit_rows``) or, where ``rows[i] == -1``, the prediction the
    row saved for position ``at`` (by an earlier forward); then, unless ``save_row == -1``, raw row
    ``save_row`` is saved as the prediction for position ``save_at`` (the first one the forward leaves
    uncached)."""

    rows: tuple[int, ...]
    at: int = -1
    save_row: int = -1
    save_at: int = -1


class Group(Protocol):
    """A pre-draft group (:class:`~s2d2.forward.segment.Predraft`): its tokens, positions and ``key``
    ``(rows, visible, head_alone)``."""

    ids: list[int]
    pos: list[int]

    @property
    def key(self) -> tuple[int, int, bool]: ...


@functools.lru_cache(maxsize=4096)
def last_rows(n: int, k: int) -> torch.Tensor:
    """Indices of the last ``k`` of ``n`` rows (a shared tensor: never modify it in place)."""
    return torch.arange(n - k, n, dtype=torch.long)


@functools.lru_cache(maxsize=1024)
def _run(k: int, n: int) -> tuple[bool, ...]:
    """``n`` flags, the first ``k`` True (a block's committed slots before its masks)."""
    return (True,) * k + (False,) * (n - k)


@functools.lru_cache(maxsize=1024)
def _consecutive(first: int, n: int) -> tuple[int, ...]:
    """``(first, ..., first + n - 1)``."""
    return tuple(range(first, first + n))


def _ints(tokens: Tokens) -> list[int]:
    """Token ids as a host list: a list as it comes (never modified), else made once."""
    if type(tokens) is list:
        return tokens
    return tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)


def prefill(length: int, ids: torch.Tensor, *, block_size: int, causal: bool) -> Layout:
    """Committed tokens ``ids`` written at ``length...`` (kept), block- or token-causally; no logits."""
    n = ids.numel()
    spec = specs.context(n, length % block_size, block_size, causal)
    return Layout(ids, torch.arange(length, length + n), spec, n, last_rows(n, 0))


def draft(
    mask_id: int,
    length: int,
    pending: Tokens,
    block: Tokens,
    *,
    start: int,
    block_size: int,
    causal: bool,
    cached: int = 0,
    extend: bool = False,
    lead: int | None = None,
) -> Layout:
    """A draft of ``block`` at positions ``start...``: ``pending`` (committed tokens at ``start -
    len(pending) .. start - 1`` not cached yet, written block-causally, or token-causally when ``causal``)
    then the block's slots from ``cached`` (with ``causal`` its committed slots attend token-causally and
    its first ``cached`` slots may already be cached), then with ``lead`` (the first masked slot) one mask
    query there that sees the cache, the pending tokens and the committed slots before it, token-causal:
    AR mode's prediction at that slot. Keeps the pending tokens (and with ``extend`` the fed block's
    leading committed slots); the block itself is never written. Logit rows: every fed slot (``cached``
    zero rows before them), then the lead's."""
    pend = _ints(pending)
    fed = block[cached:] if type(block) is list else _ints(block)[cached:]
    m, n = len(pend), len(fed) + cached
    assert length + m == start + cached, "pending tokens must end where the block's uncached part starts"
    nf = len(fed)
    first_mask = fed.index(mask_id) if mask_id in fed else nf
    if not causal:
        committed = _run(0, nf)
    elif fed.count(mask_id) == nf - first_mask:  # committed slots, then masks: the usual block
        committed = _run(first_mask, nf)
    else:
        committed = tuple([t != mask_id for t in fed])
    if lead is not None:
        assert causal and lead == cached + first_mask < n, (
            "the lead slot is the block's first masked slot, after its cached part, on a causal cache"
        )
        spec = specs.lead(m, committed, first_mask)
        fed = fed + [mask_id]
    else:
        spec = specs.draft(m, committed, block_size, causal, start % block_size)
    ids = pend + fed  # lists: the forward makes one tensor of every row's
    if cached:
        pos = [*range(start - m, start), *range(start + cached, start + n)]
    else:
        pos = list(range(start - m, start + n))
    if lead is not None:
        pos.append(start + lead)
    ext = first_mask if extend and causal else 0
    rows = len(fed)
    return Layout(ids, pos, spec, m + ext, last_rows(m + rows, rows), cached)


def lead_only(
    mask_id: int, length: int, pending: Sequence[int], block: Sequence[int], *, start: int, cached: int = 0,
    extend: bool = False,
) -> Layout:  # fmt: skip
    """The AR lead alone (:func:`~s2d2.layouts.family.lead`): ``pending``, the block's
    committed slots from ``cached`` to its first masked slot and one mask query there, token-causal."""
    m = len(pending)
    assert length + m == start + cached, "pending tokens end where the block's uncached part starts"
    first_mask = next(i for i in range(cached, len(block)) if block[i] == mask_id)
    ids = list(pending) + list(block[cached:first_mask]) + [mask_id]
    n = len(ids)
    keep = m + (first_mask - cached if extend else 0)
    return Layout(ids, list(range(length, length + n)), specs.causal(n), keep, last_rows(n, 1))


def two_halves(
    mask_id: int,
    length: int,
    filled: Tokens,
    *,
    start: int,
    slots: Sequence[int],
    cached: int,
    n_first: int,
    predrafts: Sequence[Group] = (),
) -> Layout:
    """A 2L verification of ``slots`` whose first half is ``filled[cached:n_first]`` (``max(slots)``: a
    plain verification; ``max(slots) + 1``: a fused one, whose first half may be kept), then the
    ``predrafts`` groups. Read only; logit rows: the second half, then every group row."""
    assert length == start + cached, "commit pending tokens (draft) before verifying"
    n1, n2 = n_first - cached, len(slots)
    block = filled.tolist() if isinstance(filled, torch.Tensor) else filled
    ids = list(block[cached:n_first])
    ids += [mask_id] * n2
    pos = list(range(start + cached, start + n_first))
    if n2 and slots[-1] - slots[0] == n2 - 1:  # consecutive slots (a span): ranges
        pos += range(start + slots[0], start + slots[-1] + 1)
        key = _consecutive(slots[0] - cached, n2)
    else:
        pos += [start + s for s in slots]
        key = tuple(slots) if not cached else tuple([s - cached for s in slots])
    for g in predrafts:
        ids += g.ids
        pos += g.pos
    n = len(ids)
    spec = specs.two_halves(n1, key, tuple([g.key for g in predrafts]) if predrafts else ())
    return Layout(ids, pos, spec, 0, last_rows(n, n - n1))


def score(
    mask_id: int, length: int, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int
) -> Layout:
    """Same-position scoring (:func:`~s2d2.layouts.family.score`): each scored token is
    read at a MASK query at its own position behind the tokens before it; logit rows are the MASK rows."""
    start, p = length, prefix.numel()
    ids = [prefix, torch.full((p - score_from,), mask_id, dtype=torch.long)]
    pos = [torch.arange(start, start + p), torch.arange(start + score_from, start + p)]
    rows = [torch.arange(p, 2 * p - score_from)]
    at = 2 * p - score_from
    for b in branches:
        k = b.numel()
        ids += [b[:-1], torch.full((k,), mask_id, dtype=torch.long)]
        pos += [torch.arange(start + p, start + p + k - 1), torch.arange(start + p, start + p + k)]
        rows.append(torch.arange(at + k - 1, at + 2 * k - 1))
        at += 2 * k - 1
    spec = specs.score(p, score_from, tuple(b.numel() for b in branches))
    return Layout(torch.cat(ids), torch.cat(pos), spec, p, torch.cat(rows))

"""A forward's one host-side description, made from the rows' segments, and the rows' logits back.

The engine's runner (:class:`~s2d2.engine.runner.ModelRunner`) describes each step's forward here:
:func:`describe` turns the segments (each a row's layout bound to its cache state) into ONE
:class:`~.forward_batch.ForwardBatch` (:func:`~.forward_batch.build_batch`: packed ids and positions,
write slots, page tables, each query's visibility as integers, the logit rows), padded to the shape the
adapter runs it at (:class:`Geometry`); the adapter's ``forward(pool, batch)`` returns the packed logits
``[L, vocab]`` and touches no request; :func:`per_row` splits them and applies each segment's ``finish``.
Callers outside the engine (``ModelAdapter.run``) go through the same two functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from .forward_batch import BatchShape, ForwardBatch, build_batch, grid_queries, shape_of
from .kv_pool import STORAGE_PAGE_OFFSET, check_pages
from .segment import Segment, with_zero_rows


class Geometry(NamedTuple):
    """What describing a forward needs of the model: its query and key/value heads (the head gathers)
    and ``bucket``, the padded shape a batch of a given shape runs at (a captured graph's), or None to
    run it eagerly at its own shape."""

    n_heads: int
    n_kv: int
    bucket: Callable[[BatchShape], BatchShape | None]


def describe(segments: Sequence[Segment], pool: Any, geometry: Geometry) -> ForwardBatch | None:
    """The batch of the non-empty ``segments`` (their rows in ``pool``, holding pages for ``[0, length +
    n)``: :class:`~.kv_pool.PagesNotHeld` otherwise), or None when one of them carries a float bias (the
    LLaDA2 official prefill) or a boolean mask that fits no :class:`~s2d2.layouts.mask_spec.MaskSpec`:
    the adapter then runs them its own way. Host work only."""
    specs = [None if s.bias is not None or s.context_bias else s.spec for s in segments]
    if any(sp is None for sp in specs):
        return None
    check_pages(segments)
    lengths, sizes = [s.state.length for s in segments], [s.n for s in segments]
    n_logits = sum(s.logit_rows.numel() for s in segments)
    pad = geometry.bucket(shape_of(lengths, sizes, n_logits, pool.page_size))
    # eager: rows of many queries (a prefill chunk) cut into short grid rows; padded: the bucket's grid
    max_q = grid_queries(sizes) if pad is None else None
    return build_batch(
        lengths, [s.ids for s in segments], [s.pos for s in segments], specs,
        pool.held_tables([s.state for s in segments]), [s.logit_rows for s in segments], pool.page_size,
        geometry.n_heads, geometry.n_kv, pad=pad, max_q=max_q, page_offset=STORAGE_PAGE_OFFSET,
    )  # fmt: skip


def per_row(
    segments: Sequence[Segment], raw: Sequence[torch.Tensor], vocab: int, device: torch.device,
    zero_rows: bool = True,
) -> list[torch.Tensor]:  # fmt: skip
    """Each segment's logits: ``raw`` holds the raw rows of the non-empty segments in order (an empty
    segment gets ``[0, vocab]``), each mapped by the segment's ``finish`` where it has one and, with
    ``zero_rows``, given its :attr:`~.segment.Segment.zero_rows` (without: the raw rows, views of the
    forward's output)."""
    rows = iter(raw)
    out = []
    for s in segments:
        got = next(rows) if s.n else torch.zeros(0, vocab, dtype=torch.float32, device=device)
        if s.finish is not None:
            got = s.finish(got)
        out.append(with_zero_rows(got, s.zero_rows) if zero_rows and s.zero_rows else got)
    return out

"""How a packed batch's tokens are laid out for attention: rows grouped by segment length.

Projections and MLPs run on all tokens packed together; attention needs each row's queries padded to a
common length. Padding a batch of one-token decode rows to the length of one prefill row would multiply
the attention work of every row, so segments are split into groups of similar length (a long group and
a short group at most), each padded to its own longest segment. A group gathers its rows' keys/values
from the paged pool (:mod:`~s2d2.adapters.kv_pool`) with one index of every (row, head, position) into
the pool's rows of ``head_dim`` values, built once a step from the page tables and used by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .segment import Segment


@dataclass
class AttentionGroup:
    """Segments attended together. ``tokens`` ``[t]`` index the packed sequence; ``row`` / ``col``
    ``[t]`` place each token in the padded ``[n_rows, n_q]`` query grid; ``index`` ``[n_rows * kv_heads *
    n_k]`` picks, for each row, head and key position in order, its vector in a layer buffer viewed as
    ``[(num_pages + 1) * kv_heads * page_size, head_dim]`` (the zero page past a row's own pages);
    ``mask`` is the float ``[n_rows, 1, n_q, n_k]`` mask."""

    tokens: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    n_rows: int
    n_q: int
    n_k: int
    index: torch.Tensor
    mask: torch.Tensor


def group_mask(
    segments: Sequence[Segment], rows: Sequence[int], n_rows: int, n_q: int, n_k: int
) -> torch.Tensor:
    """Float attention mask ``[n_rows, 1, n_q, n_k]`` (0 = visible, -inf = hidden).

    Segment i occupies attention row ``rows[i]``: its valid queries see its cached keys ``[0, length)``
    and its own new keys as its ``mask`` allows. Padding queries and rows without a segment see key 0
    only (finite output, never read).
    """
    R = len(segments)
    lengths = torch.tensor([s.state.length for s in segments])[:, None, None]
    sizes = torch.tensor([s.n for s in segments])[:, None, None]
    inner = torch.zeros(R, n_q, n_q, dtype=torch.bool)
    for r, seg in enumerate(segments):
        inner[r, : seg.n, : seg.n] = seg.mask
    k = torch.arange(n_k)[None, None, :]
    q = torch.arange(n_q)[None, :, None]
    rel = (k - lengths).clamp(0, n_q - 1).expand(R, n_q, n_k)
    new = (k >= lengths) & (k < lengths + sizes) & inner.gather(2, rel)
    valid = q < sizes
    visible = valid & ((k < lengths) | new)
    visible |= ~valid & (k == 0)  # padding queries: key 0 only
    bias = torch.zeros(R, n_q, n_k)
    for r, seg in enumerate(segments):
        if seg.bias is not None or seg.context_bias:
            ctx, n = seg.state.length, seg.n
            bias[r, :n, :ctx] = seg.context_bias
            if seg.bias is not None:
                bias[r, :n, ctx : ctx + n] = seg.bias.float()
    out = torch.full((n_rows, n_q, n_k), float("-inf"))
    out[:, :, 0] = 0.0
    out[torch.tensor(list(rows))] = bias.masked_fill(~visible, float("-inf"))
    return out[:, None]


def split_by_length(segments: Sequence[Segment]) -> list[list[int]]:
    """Segment indices in one group, or two (short, long) when the longest segments are much longer
    than the typical one (a prefill chunk among decode steps)."""
    lengths = sorted(s.n for s in segments)
    typical = lengths[(len(lengths) - 1) // 2]
    cut = max(4 * typical, 8)
    if lengths[-1] <= cut or lengths[0] > cut:
        return [list(range(len(segments)))]
    short = [i for i, s in enumerate(segments) if s.n <= cut]
    return [short, [i for i, s in enumerate(segments) if s.n > cut]]


def query_grid(
    starts: Sequence[int], sizes: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For segments at packed offsets ``starts`` of ``sizes`` tokens: every token's packed index, its
    row (the segment's place in the group) and its column in the row, each ``[sum(sizes)]``."""
    n = torch.tensor(list(sizes))
    row = torch.repeat_interleave(torch.arange(len(n)), n)
    col = torch.arange(int(n.sum())) - (n.cumsum(0) - n)[row]
    return torch.tensor(list(starts))[row] + col, row, col


def key_index(tables: torch.Tensor, n_k: int, n_kv: int, page_size: int) -> torch.Tensor:
    """The flat gather index ``[rows * n_kv * n_k]`` of the first ``n_k`` positions of every head of the
    rows whose storage pages are ``tables`` ``[rows, pages]`` (on the tables' device)."""
    j = torch.arange(n_k, device=tables.device)
    pages = tables[:, j // page_size]  # [rows, n_k]
    heads = torch.arange(n_kv, device=tables.device)[None, :, None]
    return ((pages[:, None, :] * n_kv + heads) * page_size + j % page_size).reshape(-1)


def build_groups(
    segments: Sequence[Segment],
    tables: torch.Tensor,
    page_size: int,
    n_kv: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[AttentionGroup]:
    """The attention groups of a packed batch (see the module docstring); ``tables`` ``[rows, pages]``
    (on ``device``) holds each segment's storage pages, padded with the zero page."""
    starts = [0]
    for s in segments[:-1]:
        starts.append(starts[-1] + s.n)
    groups = []
    for idx in split_by_length(segments):
        segs = [segments[i] for i in idx]
        rows = list(range(len(segs)))
        n_q = max(s.n for s in segs)
        n_k = max(s.state.length + s.n for s in segs)
        tokens, row, col = query_grid([starts[i] for i in idx], [s.n for s in segs])
        mask = group_mask(segs, rows, len(segs), n_q, n_k).to(device=device, dtype=dtype)
        rows_tables = tables if len(idx) == len(segments) else tables[torch.tensor(idx, device=device)]
        index = key_index(rows_tables, n_k, n_kv, page_size)
        grid = (tokens.to(device), row.to(device), col.to(device))
        groups.append(AttentionGroup(*grid, len(segs), n_q, n_k, index, mask))
    return groups

"""How a packed batch's tokens are laid out for attention: rows grouped by segment length.

Projections and MLPs run on all tokens packed together; attention needs each row's queries padded to a
common length. Padding a batch of one-token decode rows to the length of one prefill row would multiply
the attention work of every row, and padding drafts to the length of verifications wastes a third of
it, so segments are split into groups of similar length where the padding saved outweighs a group's
own cost (:func:`split_by_length`), each padded to its own longest segment. A group reads its rows'
keys/values from the paged pool (:mod:`~s2d2.forward.kv_pool`) a whole page at a time, with one
index of pages built once a step from the page tables and used by every layer; a group of one row
whose pages are consecutive reads them in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .host_lists import long_tensor
from .segment import Segment


@dataclass
class AttentionGroup:
    """Segments attended together, ``n_rows`` rows of ``n_q`` padded queries over ``n_k`` keys (whole
    pages). ``tokens`` ``[t]`` index the packed sequence (None: the group is the whole sequence, in
    order); ``row`` / ``col`` ``[t]`` place each token in the padded ``[n_rows, n_q]`` query grid (None:
    one row, the tokens in order). Keys and values are pages of a head-major layer buffer ``[kv_heads,
    num_pages + 1, page_size, head_dim]``: ``pages`` ``[n_rows * n_k / page_size]`` lists each row's
    storage pages in order (the zero page past a row's own), or is None when the group is one row whose
    pages are consecutive from ``first_page`` (read as a view). ``mask`` is the float ``[1, n_rows, n_q,
    n_k]`` mask (broadcast over heads)."""

    tokens: torch.Tensor | None
    row: torch.Tensor | None
    col: torch.Tensor | None
    n_rows: int
    n_q: int
    n_k: int
    pages: torch.Tensor | None
    first_page: int
    mask: torch.Tensor


def group_mask(
    segments: Sequence[Segment], rows: Sequence[int], n_rows: int, n_q: int, n_k: int
) -> torch.Tensor:
    """Float attention mask ``[1, n_rows, n_q, n_k]`` (0 = visible, -inf = hidden).

    Segment i occupies attention row ``rows[i]``: its valid queries see its cached keys ``[0, length)``
    and its own new keys as its ``mask`` allows. Padding queries and rows without a segment see key 0
    only (finite output, never read).
    """
    R = len(segments)
    lengths = long_tensor([s.state.length for s in segments])[:, None, None]
    sizes = long_tensor([s.n for s in segments])[:, None, None]
    # rows share mask objects (memoised by shape): each distinct one is placed once
    where: dict[int, int] = {}
    distinct: list[Segment] = []
    for seg in segments:
        if where.setdefault(id(seg.dense), len(distinct)) == len(distinct):
            distinct.append(seg)
    inner = torch.zeros(len(distinct), n_q, n_q, dtype=torch.bool)
    for u, seg in enumerate(distinct):
        inner[u, : seg.n, : seg.n] = seg.dense
    if len(distinct) < R:
        inner = inner[long_tensor([where[id(seg.dense)] for seg in segments])]
    k = torch.arange(n_k)[None, None, :]
    q = torch.arange(n_q)[None, :, None]
    rel = (k - lengths).clamp(0, n_q - 1).expand(R, n_q, n_k)
    valid = q < sizes
    visible = inner.gather(2, rel)  # in place from here: each operation reads and writes one tensor
    visible &= (k >= lengths) & (k < lengths + sizes)  # the row's new keys, as its mask allows
    visible |= k < lengths  # its cached keys
    visible &= valid
    visible[:, :, 0] |= ~valid[:, :, 0]  # padding queries: key 0 only
    biased = any(seg.bias is not None or seg.context_bias for seg in segments)
    if not biased and n_rows == R and list(rows) == list(range(R)):  # every row, no bias: the mask alone
        return torch.where(visible, 0.0, float("-inf"))[None]
    bias = torch.zeros(R, n_q, n_k)
    for r, seg in enumerate(segments):
        if seg.bias is not None or seg.context_bias:
            ctx, n = seg.state.length, seg.n
            bias[r, :n, :ctx] = seg.context_bias
            if seg.bias is not None:
                bias[r, :n, ctx : ctx + n] = seg.bias.float()
    out = torch.full((n_rows, n_q, n_k), float("-inf"))
    out[:, :, 0] = 0.0
    out[long_tensor(list(rows))] = bias.masked_fill(~visible, float("-inf"))
    return out[None]


def one_row_mask(seg: Segment, n_k: int) -> torch.Tensor:
    """:func:`group_mask` of a group of the one segment ``seg`` without a bias, in four operations:
    ``[1, 1, seg.n, n_k]``, its cache visible, its new keys as its ``mask`` allows, nothing past them."""
    length, n = seg.state.length, seg.n
    out = torch.full((1, 1, n, n_k), float("-inf"))
    out[..., :length] = 0.0
    out[0, 0, :, length:length + n].masked_fill_(seg.dense, 0.0)
    return out


#: What one more attention group costs a forward, in padded query-key pairs: its gathers, mask and
#: kernels, against the pairs that padding rows of other query counts together would compute.
GROUP_COST = 8192
#: Per row and key, padded attention also costs about this many query-key pairs (the key's gather,
#: its softmax column): few-query rows cost more per pair than many-query ones.
KEY_COST = 4
#: Query counts split into at most this many runs before grouping (bounds the search).
MAX_BUCKETS = 8


def split_by_length(segments: Sequence[Segment]) -> list[list[int]]:
    """Segment indices per attention group, each group padded to its longest segment and its most keys.

    Rows are taken in order of their query count (a run of counts per group) and cut where the pairs
    that padding saves exceed :data:`GROUP_COST` a group: decode rows apart from a prefill chunk,
    drafts apart from verifications. The cuts minimise ``sum(rows * (queries + KEY_COST) * keys) +
    GROUP_COST * groups`` over runs of the distinct counts (grouped into :data:`MAX_BUCKETS` runs
    when there are more), by dynamic programming."""
    by_n: dict[int, list[int]] = {}
    for i, s in enumerate(segments):
        by_n.setdefault(s.n, []).append(i)
    if len(by_n) == 1:
        return [list(range(len(segments)))]
    values = sorted(by_n)
    per = -(-len(values) // MAX_BUCKETS)
    buckets = [values[i:i + per] for i in range(0, len(values), per)]
    rows = [sum(len(by_n[n]) for n in b) for b in buckets]
    keys = [max(segments[i].state.length + n for n in b for i in by_n[n]) for b in buckets]
    best, cut = [0.0] + [float("inf")] * len(buckets), [0] * (len(buckets) + 1)
    for j in range(1, len(buckets) + 1):
        n_rows = n_keys = 0
        for i in range(j - 1, -1, -1):  # the group of buckets i..j-1
            n_rows, n_keys = n_rows + rows[i], max(n_keys, keys[i])
            cost = best[i] + n_rows * (buckets[j - 1][-1] + KEY_COST) * n_keys + GROUP_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(buckets)
    while j > 0:
        groups.append(sorted(i for b in buckets[cut[j]:j] for n in b for i in by_n[n]))
        j = cut[j]
    return groups[::-1]


def query_grid(
    starts: Sequence[int], sizes: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For segments at packed offsets ``starts`` of ``sizes`` tokens: every token's packed index, its
    row (the segment's place in the group) and its column in the row, each ``[sum(sizes)]``."""
    n = long_tensor(list(sizes))
    row = torch.repeat_interleave(torch.arange(len(n)), n)
    col = torch.arange(int(n.sum())) - (n.cumsum(0) - n)[row]
    return long_tensor(list(starts))[row] + col, row, col


def consecutive(pages: Sequence[int]) -> bool:
    """Whether storage ``pages`` are ``p, p + 1, ...`` (one stretch of every head's buffer)."""
    return bool(pages) and all(b == a + 1 for a, b in zip(pages, pages[1:], strict=False))


def build_groups(
    segments: Sequence[Segment],
    page_lists: Sequence[Sequence[int]],
    tables: torch.Tensor,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[AttentionGroup]:
    """The attention groups of a packed batch (see the module docstring). ``page_lists`` holds each
    segment's storage pages, ``tables`` ``[rows, pages]`` (on ``device``) the same padded with the zero
    page."""
    starts = [0]
    for s in segments[:-1]:
        starts.append(starts[-1] + s.n)
    split = split_by_length(segments)
    groups = []
    for idx in split:
        segs = [segments[i] for i in idx]
        n_q = max(s.n for s in segs)
        width = -(-max(s.state.length + s.n for s in segs) // page_size)
        n_k = width * page_size
        tokens = row = col = None  # one group: the whole packed sequence; one row: its tokens in order
        if len(segs) > 1:
            tokens, row, col = query_grid([starts[i] for i in idx], [s.n for s in segs])
        elif len(split) > 1:
            tokens = torch.arange(starts[idx[0]], starts[idx[0]] + n_q)
        if len(split) == 1:
            tokens = None
        plain = len(segs) == 1 and segs[0].bias is None and not segs[0].context_bias
        rows = range(len(segs))
        mask = one_row_mask(segs[0], n_k) if plain else group_mask(segs, rows, len(segs), n_q, n_k)
        mask = mask.to(device=device, dtype=dtype)
        own = page_lists[idx[0]][:width]
        if len(segs) == 1 and len(own) == width and consecutive(own):
            pages, first = None, own[0]
        else:
            rows_tables = tables if len(idx) == len(segments) else tables[torch.tensor(idx, device=device)]
            pages, first = rows_tables[:, :width].reshape(-1), 0
        grid = [None if t is None else t.to(device) for t in (tokens, row, col)]
        groups.append(AttentionGroup(*grid, len(segs), n_q, n_k, pages, first, mask))
    return groups

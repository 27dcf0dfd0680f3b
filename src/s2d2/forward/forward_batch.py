"""One forward's host-side description: packed tokens, where their keys go, what each query sees.

A :class:`ForwardBatch` is everything the paged forward (:mod:`~s2d2.forward.paged_forward`) needs and
nothing of a request: packed token ids and positions, each token's write slot in the paged pool (keys
and values are written there before attention reads them in place), each row's page table, each query's
visibility as a few integers (:mod:`~s2d2.layouts.mask_spec`: row-logical key bounds, not an ``n x n``
mask), the query grid attention pads rows into, and the packed indices of the logit rows. It is built
in numpy (no device work, no dispatched tensor ops) and goes to the device as ONE int64 tensor.

The query grid has ``rows`` grid rows of ``n_q`` places. By default a grid row is a batch row. With
``max_q`` a row of more queries is cut into several grid rows of at most ``max_q`` each (all of them
with the row's page table and the row's key numbering): a prefill chunk among decode rows then costs
the grid a few short rows, not every row padded to the chunk's length (:func:`grid_queries` picks
``max_q`` for a batch). Visibility is by key number, so where a query sits in the grid changes nothing
it sees.

Key numbering: a row's keys are its pool positions ``[0, length + n)``, cache first, then the
segment's new tokens in order. Query ``j`` of a row with ``length`` cached keys sees keys ``[0, hi)``,
``[win_lo, win_hi)`` and key ``self_key`` (``-1``: none); padding queries see key 0 only.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..layouts.mask_spec import MaskSpec

#: the row types :func:`_flat` reads in one pass
_LIST = {list}
#: the int64 fields of a batch, in blob order (each a flat array)
FIELDS = ("ids", "pos", "slot", "pages", "q_index", "out_index", "hi", "win_lo", "win_hi", "self_key",
          "logit_index", "q_gather", "out_gather")  # fmt: skip


class BatchShape(NamedTuple):
    """The sizes a forward's tensors take: ``tokens`` packed, ``rows``, ``n_q`` queries and ``width`` pages
    a row, ``logits`` rows out. A batch padded to a shape runs the same kernels as any other batch of
    that shape (a CUDA graph is captured per shape)."""

    tokens: int
    rows: int
    n_q: int
    width: int
    logits: int

    def holds(self, other: BatchShape) -> bool:
        return all(a >= b for a, b in zip(self, other, strict=True))


@dataclass
class ForwardBatch:
    """A packed forward of ``rows`` rows, ``tokens`` new tokens (see the module docstring).

    Per token ``[tokens]``: ``ids``, ``pos``, ``slot`` (flat pool slot ``page * page_size + offset``).
    Per row: ``pages`` ``[rows * width]`` (page tables padded with the zero page; ``n_k = width *
    page_size`` keys a row). Query grid ``[rows * n_q]``: ``q_index`` (the packed token at each grid
    place; padding: token 0) and the visibility ``hi``, ``win_lo``, ``win_hi``, ``self_key``; ``out_index``
    ``[tokens]`` is each token's grid place. ``logit_index`` ``[L]``: packed tokens whose logits come back,
    ``logit_sizes`` how many of them each row has. ``q_gather`` / ``out_gather`` map heads between packed
    order and the attention grid (:func:`head_gathers`). Fields are numpy arrays on the host; :meth:`to`
    returns a copy whose fields are tensors on a device (one transfer)."""

    rows: int
    tokens: int
    n_q: int
    width: int
    page_size: int
    logit_sizes: list[int]
    ids: np.ndarray | torch.Tensor
    pos: np.ndarray | torch.Tensor
    slot: np.ndarray | torch.Tensor
    pages: np.ndarray | torch.Tensor
    q_index: np.ndarray | torch.Tensor
    out_index: np.ndarray | torch.Tensor
    hi: np.ndarray | torch.Tensor
    win_lo: np.ndarray | torch.Tensor
    win_hi: np.ndarray | torch.Tensor
    self_key: np.ndarray | torch.Tensor
    logit_index: np.ndarray | torch.Tensor
    q_gather: np.ndarray | torch.Tensor
    out_gather: np.ndarray | torch.Tensor

    @property
    def n_k(self) -> int:
        return self.width * self.page_size

    @property
    def shape(self) -> BatchShape:
        return BatchShape(self.tokens, self.rows, self.n_q, self.width, int(len(self.logit_index)))

    def to(self, device: torch.device) -> ForwardBatch:
        """The batch with every field a tensor on ``device``: one int64 blob, one copy, split in views."""
        parts = [np.asarray(getattr(self, f), dtype=np.int64) for f in FIELDS]
        blob = torch.from_numpy(np.concatenate(parts)).to(device)
        views = blob.split([p.size for p in parts])
        out = ForwardBatch(self.rows, self.tokens, self.n_q, self.width, self.page_size, self.logit_sizes,
                           *views)  # fmt: skip
        return out


def field_sizes(shape: BatchShape, n_heads: int) -> list[int]:
    """How many int64 values each of :data:`FIELDS` holds in a batch of ``shape`` (the static buffers of a
    shape are made before any batch of it exists)."""
    T, R, n_q, W, L = shape
    grid = R * n_q
    return [T, T, T, R * W, grid, T, grid, grid, grid, grid, L, n_heads * grid, T * n_heads]


def shape_of(lengths: Sequence[int], sizes: Sequence[int], n_logits: int, page_size: int) -> BatchShape:
    """The unpadded :class:`BatchShape` of rows with ``lengths`` cached keys feeding ``sizes`` tokens."""
    if len(lengths) != len(sizes):
        raise ValueError(f"{len(lengths)} lengths for {len(sizes)} rows")
    return BatchShape(sum(sizes), len(sizes), max(sizes), _width(lengths, sizes, page_size), n_logits)


def _width(lengths: Sequence[int], sizes: Sequence[int], page_size: int) -> int:
    """The pages the longest of rows with ``lengths`` cached keys feeding ``sizes`` new tokens covers (0
    for no rows)."""
    return -(-max(map(operator.add, lengths, sizes), default=0) // page_size)


def _flat(parts: Sequence[Sequence[int] | torch.Tensor | np.ndarray], count: int) -> np.ndarray:
    """Rows' ids (or positions) end to end as one int64 array of ``count`` entries (lists read in one
    pass; tensors and arrays as arrays)."""
    if set(map(type, parts)) <= _LIST:
        return np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64, count=count)
    return np.concatenate([_array(p) for p in parts]) if parts else np.zeros(0, dtype=np.int64)


def _logit_index(
    logit_rows: Sequence[torch.Tensor | np.ndarray], starts: np.ndarray, counts: list[int]
) -> np.ndarray:
    """The packed indices of every row's logit rows (``logit_rows[r]``, ``counts[r]`` of them, index row
    ``r``'s new tokens, which start at ``starts[r]``): one concatenation, the offsets added in one pass."""
    if all(map(isinstance, logit_rows, itertools.repeat(torch.Tensor))):
        inner = torch.cat(list(logit_rows)).numpy().astype(np.int64, copy=False)
    else:
        inner = np.concatenate([_array(lr) for lr in logit_rows])
    return inner + np.repeat(starts, counts)


def _array(p: Sequence[int] | torch.Tensor | np.ndarray) -> np.ndarray:
    return p.numpy().astype(np.int64, copy=False) if isinstance(p, torch.Tensor) else np.asarray(p, np.int64)


def build_batch(
    lengths: Sequence[int],
    ids: Sequence[Sequence[int]],
    pos: Sequence[Sequence[int]],
    specs: Sequence[MaskSpec],
    tables: Sequence[Sequence[int]],
    logit_rows: Sequence[np.ndarray],
    page_size: int,
    n_heads: int = 1,
    n_kv: int = 1,
    pad: BatchShape | None = None,
    max_q: int | None = None,
    page_offset: int = 0,
) -> ForwardBatch:
    """The batch of rows with ``lengths`` cached keys feeding ``ids`` at ``pos`` whose queries see what
    ``specs`` say among their new keys (and their whole cache); ``tables`` are the rows' page tables
    (covering ``length + n`` positions); ``logit_rows`` index each row's new tokens; ``n_heads`` /
    ``n_kv``: the model's query and key/value heads (for the head gathers). With ``pad`` (at least the
    batch's own :class:`BatchShape`) every size is padded to it: padding tokens write their keys to
    slot 0 (the zero page's first slot: finite, never visible) and padding rows see the zero page.
    ``max_q`` (>= 1): cut rows into grid rows of at most that many queries (see the module docstring).
    ``page_offset`` is added to every entry of ``tables`` (tables in a page pool's numbering)."""
    R0 = len(lengths)
    size_list = list(map(len, ids))
    T0 = sum(size_list)
    top = max(size_list, default=0)
    cut = top if max_q is None or not R0 else min(int(max_q), top)
    if cut < 1 and R0:
        raise ValueError(f"max_q must be >= 1, got {max_q}")
    sizes = np.array(size_list, dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    row = np.repeat(np.arange(R0), sizes)  # each new token's row
    col = np.arange(T0) - starts[row]  # and its place in the row
    if cut >= top:  # every row one grid row (the usual)
        owner, n_grid = None, R0
    else:
        parts = -(-sizes // cut)  # grid rows a row takes
        owner = np.repeat(np.arange(R0), parts)  # each grid row's batch row
        n_grid = int(owner.size)
    width = _width(lengths, size_list, page_size)
    counts = [len(lr) if type(lr) is list else lr.shape[0] for lr in logit_rows]
    L0 = sum(counts)
    own = BatchShape(T0, n_grid, cut, width, L0)
    if pad is not None and not pad.holds(own):
        raise ValueError(f"a batch of shape {own} does not fit the padded shape {pad}")
    T, R, n_q, width, L = pad if pad is not None else own
    table = _tables(tables, width, page_offset).reshape(R0, width) if R0 else np.zeros((1, width), np.int64)
    pages = np.zeros((R, width), dtype=np.int64)
    pages[:n_grid] = table if owner is None else table[owner]
    length = np.array(lengths, dtype=np.int64)
    base = length[row]
    key = base + col  # each new token's key (row-logical)
    page, offset = np.divmod(key, page_size)
    slot = table[row, page] * page_size + offset
    if owner is None:
        grid = row * n_q + col
    else:
        first = np.cumsum(parts) - parts  # each row's first grid row
        grid = (first[row] + col // cut) * n_q + col % cut
    q_index = np.zeros(R * n_q, dtype=np.int64)
    q_index[grid] = np.arange(T0)
    vis = np.zeros((4, R * n_q), dtype=np.int64)  # hi (padding: key 0 only), win_lo, win_hi, self_key
    vis[0] = 1
    vis[3] = -1
    if R0:
        s = np.concatenate([sp.host for sp in specs], axis=1)
        vis[:3, grid] = s[:3] + base
        vis[3, grid] = np.where(s[3], key, -1)
    logit_index = _logit_index(logit_rows, starts, counts)
    grid = _padded(grid, T)
    q_gather, out_gather = head_gathers(R, n_q, q_index, grid, n_heads, n_kv)
    return ForwardBatch(
        R, T, n_q, width, page_size, counts,
        _padded(_flat(ids, T0), T),
        _padded(_flat(pos, T0), T),
        _padded(slot, T), pages.reshape(-1), q_index, grid, vis[0], vis[1], vis[2], vis[3],
        _padded(logit_index, L), q_gather, out_gather,
    )  # fmt: skip


def _tables(tables: Sequence[Sequence[int]], width: int, offset: int) -> np.ndarray:
    """The rows' page tables ``[rows * width]``: each cut or padded to ``width`` entries, ``offset`` added
    to every held entry and padding the zero page (0)."""
    pad = -offset  # padding entries become 0 when the offset is added to all
    flat: list[int] = []
    for t in tables:
        n = len(t)
        if n >= width:
            flat += t[:width] if n > width else t
        else:
            flat += t
            flat += [pad] * (width - n)
    out = np.array(flat, dtype=np.int64)
    if offset:
        out += offset
    return out


#: what a grid row costs attention beyond its queries, in query places (its page gathers and rows)
GRID_ROW_COST = 2


def grid_queries(sizes: Sequence[int]) -> int:
    """The ``max_q`` for :func:`build_batch` that makes the query grid cheapest for rows of ``sizes``
    queries: the cut among the sizes minimising ``grid rows * (places a row + GRID_ROW_COST)`` (every grid
    row has the batch's widest page table, so keys scale both alike). Rows of one size keep one grid row
    each."""
    top = max(sizes)
    if min(sizes) == top:  # one size (steady decode rows): no cut
        return top
    counts = Counter(sizes)
    best, best_cost = top, None
    for cut in sorted(counts):
        cost = sum(-(-n // cut) * k for n, k in counts.items()) * (cut + GRID_ROW_COST)
        if best_cost is None or cost < best_cost:
            best, best_cost = cut, cost
    return best


def _padded(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` with zeros appended up to ``n`` entries."""
    return a if a.size == n else np.concatenate([a, np.zeros(n - a.size, dtype=np.int64)])


def head_gathers(
    rows: int, n_q: int, q_index: np.ndarray, grid: np.ndarray, n_heads: int, n_kv: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gather indices between packed heads and the padded attention grid ``[kv, rows, rep, n_q]`` (GQA's
    ``rep = n_heads / n_kv`` query heads of a key head folded into the query axis). ``q_gather``
    ``[kv * rows * rep * n_q]``: for grid place ``(g, r, e, j)``, row ``t * (H + kv) + g * rep + e`` of
    the flattened ``[T * (H + kv), hd]`` roped queries and keys; ``out_gather`` ``[T * H]``: for packed
    ``(t, h)``, its place in the flattened grid output."""
    rep = n_heads // n_kv
    head_rows, kv_of, within = _heads(n_heads, n_kv)
    q_gather = q_index.reshape(1, rows, 1, n_q) * (n_heads + n_kv) + head_rows
    # packed (t, h) at grid row r, place j: ((h // rep * rows + r) * rep + h % rep) * n_q + j, split into
    # a part of the token (r * rep * n_q + j) and a part of the head
    r, j = np.divmod(grid, n_q)
    token = r * (rep * n_q) + j
    head = (kv_of * (rows * rep) + within) * n_q
    return q_gather.reshape(-1), (token[:, None] + head).reshape(-1)


@functools.lru_cache(maxsize=64)
def _heads(n_heads: int, n_kv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For :func:`head_gathers`: ``g * rep + e`` as ``[kv, 1, rep, 1]``, and each query head's key head
    (``h // rep``) and place among its key head's (``h % rep``) as ``[1, H]`` (shared: never modify)."""
    rep = n_heads // n_kv
    g = np.arange(n_kv).reshape(n_kv, 1, 1, 1)
    e = np.arange(rep).reshape(1, 1, rep, 1)
    h = np.arange(n_heads)[None, :]
    out = (g * rep + e, h // rep, h % rep)
    for a in out:
        a.flags.writeable = False
    return out

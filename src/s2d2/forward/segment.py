"""One row's share of a batched forward: its new tokens, their positions and what its queries see.

A segment is a :class:`~s2d2.layouts.layout.Layout` (what the row feeds, built as integers) bound to
the row's cache state. Every model call of the decoding engine is a list of :class:`Segment` objects,
one per running row, run as one batched forward (:meth:`s2d2.families.hf.HFAdapter.run`). A segment's
queries always see the whole of its row's cache (``state.length`` keys); among its own new tokens they
see what ``mask`` allows (a :class:`~s2d2.layouts.mask_spec.MaskSpec`, as the layouts make it, or a
boolean matrix). The first ``keep`` new tokens' keys/values stay in the cache (the row's length advances
by ``keep``); the rest are written but not kept, so a read-only forward (a draft block, a verification)
costs no copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..layouts import specs
from ..layouts.layout import Layout, Realign, last_rows
from ..layouts.mask_spec import MaskSpec, SpecCache, dense
from .host_lists import long_tensor
from .kv_pool import KVState

#: ``state.extra`` key: ``(position, logits row [V] predicting the token at that position)``, what a
#: shifted family's forward saves for the row's next one (:class:`~s2d2.layouts.layout.Realign`)
NEXT_LOGITS = "shifted.next_logits"
#: boolean masks' specs, converted once per mask object (callers that build masks memoise them)
_SPECS = SpecCache()
#: specs' boolean matrices (the fallback paths' only), made once per spec object
_DENSE = SpecCache()


@dataclass(slots=True)
class Segment:
    """The new tokens of one row in one forward.

    ``ids`` and ``pos`` are ``[n]`` token ids and absolute positions, as long tensors or as int lists
    (the lean forward packs every row's lists into one tensor a step, :func:`packed`); ``mask`` is what
    the queries see among the new tokens: a :class:`MaskSpec` (the layouts') or a boolean ``[n, n]``
    matrix (True = the query may see the key; :attr:`spec` and :attr:`dense` give either form).
    ``bias`` (optional, ``[n, n]`` float) is added to the scores of the visible new keys and
    ``context_bias`` to those of the cached keys (the LLaDA2 official prefill). ``logit_rows`` are the
    indices (into the segment) whose logits the caller needs; ``finish`` maps those raw rows
    ``[len(logit_rows), vocab]`` to what the adapter returns (the shifted family re-aligns them); it runs
    as the logits come back, before the row's length advances, and writes nothing to the row.
    ``zero_rows``: all-zero rows the adapter puts before the logit rows (a partly cached block's cached
    slots, never read: :func:`with_zero_rows`), so that row ``i`` of what it returns is block slot ``i``;
    the engine's runner leaves them out and its step reads the raw rows at slot minus ``zero_rows``.
    """

    state: KVState
    ids: torch.Tensor | list[int]
    pos: torch.Tensor | list[int]
    mask: torch.Tensor | MaskSpec
    keep: int
    logit_rows: torch.Tensor
    finish: Callable[[torch.Tensor], torch.Tensor] | None = None
    bias: torch.Tensor | None = None
    context_bias: float = 0.0
    zero_rows: int = 0
    #: what the forward computed for the row to save (a shifted family's ``(position, logits row [V])``,
    #: set by ``finish``): part of the forward's output, kept in the row's state by whoever advances the
    #: row (:meth:`keep_prediction`), never by the forward
    saves: tuple[int, torch.Tensor] | None = None
    #: how many new tokens the segment feeds (from ``ids``)
    n: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.n = len(self.ids) if isinstance(self.ids, list) else int(self.ids.numel())

    #: indices of the last ``k`` of ``n`` rows (a shared tensor: never modify it in place)
    last_rows = staticmethod(last_rows)

    @classmethod
    def of(cls, state: KVState, layout: Layout) -> Segment:
        """The row ``state``'s segment of ``layout``: its zero rows, if any (:attr:`zero_rows`), or its
        raw rows re-aligned by ``finish`` (:func:`realigned`); a bias layout's float mask (:attr:`bias`)."""
        seg = cls(state, layout.ids, layout.pos, layout.spec, keep=layout.keep, logit_rows=layout.logit_rows,
                  zero_rows=layout.zero_rows)  # fmt: skip
        if layout.bias:  # the visibility as an additive 1.0/0.0 float mask; every key visible
            seg.bias = seg.dense.to(torch.float32)
            seg.context_bias = 1.0
            seg.mask = specs.full(seg.n)
        if layout.realign is not None:
            seg.finish = realigned(seg, layout.realign)
        return seg

    def keep_prediction(self) -> None:
        """Keep the prediction the forward computed for the row (:attr:`saves`, if any) in its state, for
        the row's next forward to read (:data:`NEXT_LOGITS`): the writer's call, after the forward."""
        if self.saves is not None:
            self.state.extra[NEXT_LOGITS] = self.saves

    @property
    def spec(self) -> MaskSpec | None:
        """The visibility as a :class:`MaskSpec`, or None for a boolean mask that does not fit one."""
        return self.mask if isinstance(self.mask, MaskSpec) else _SPECS.get(self.mask)

    @property
    def dense(self) -> torch.Tensor:
        """The visibility as a boolean ``[n, n]`` matrix (for the grouped and the native forward)."""
        if not isinstance(self.mask, MaskSpec):
            return self.mask
        return _DENSE.get(self.mask, dense)


def with_zero_rows(logits: torch.Tensor, zero_rows: int) -> torch.Tensor:
    """``logits`` ``[k, vocab]`` with ``zero_rows`` all-zero rows before them (one op; none: as they are)."""
    return F.pad(logits, (0, 0, zero_rows, 0)) if zero_rows else logits


def realigned(seg: Segment, r: Realign) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ``finish`` of a shifted family's segment ``seg``: returns its raw rows re-aligned by ``r`` (one
    slice where the map is a run of rows, behind the saved row or not; else one stack), reading the
    row's saved prediction from its state; the new prediction to save goes to ``seg.saves`` (the row's
    state is not written here: :meth:`Segment.keep_prediction`)."""
    rows, k, state = r.rows, len(r.rows), seg.state
    lead = 1 if k and rows[0] == -1 else 0
    first = rows[lead] if k > lead else 0
    run = all(i == first + j for j, i in enumerate(rows[lead:]))

    def finish(raw: torch.Tensor) -> torch.Tensor:
        if run:
            out = raw[first : first + k - lead]
            if lead:
                head = saved(state, r.at, raw)[None]
                out = torch.cat([head, out]) if out.shape[0] else head
        else:
            out = torch.stack([saved(state, r.at, raw) if i < 0 else raw[i] for i in rows])
        if r.save_row >= 0:
            seg.saves = (r.save_at, raw[r.save_row])
        return out

    return finish


def saved(state: KVState, pos: int, raw: torch.Tensor) -> torch.Tensor:
    """The prediction ``state`` saved for position ``pos`` (zeros, i.e. uniform, when ``pos == 0``)."""
    got = state.extra.get(NEXT_LOGITS)
    if got is not None and got[0] == pos:
        return got[1]
    if pos == 0:
        return raw.new_zeros(raw.shape[-1])
    raise RuntimeError(
        f"no saved prediction for position {pos}: the cache must be written by this adapter's "
        "prefill/commit/draft (or pass the last committed tokens as `pending`)"
    )


def packed(parts: Sequence[torch.Tensor | list[int]]) -> torch.Tensor:
    """Segments' ``ids`` (or ``pos``) end to end, one long ``[sum n]`` host tensor: one tensor made from
    the lists, not one a row."""
    if all(isinstance(p, list) for p in parts):
        return long_tensor(list(itertools.chain.from_iterable(parts)))
    return torch.cat([torch.as_tensor(p, dtype=torch.long) for p in parts])


@dataclass(frozen=True)
class Predraft:
    """A group of next-step draft queries carried by a fused verification forward.

    ``ids`` / ``pos`` (``g`` ints each): its tokens and absolute positions; its rows see the cache, the
    first ``visible`` tokens of the verification's first half (the draft-filled block, token-causal) and
    each other, except that with ``head_alone`` the first row (a committed correction) sees only itself.
    """

    ids: list[int]
    pos: list[int]
    visible: int
    head_alone: bool = False

    @property
    def key(self) -> tuple[int, int, bool]:
        """What the group's mask depends on: ``(rows, visible, head_alone)``."""
        return len(self.ids), self.visible, self.head_alone

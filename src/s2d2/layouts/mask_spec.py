"""A segment's attention mask as a few integers a query: a prefix, at most one window, itself.

Every layout (:mod:`~s2d2.layouts.layout`; the boolean oracle :mod:`~s2d2.forward.masks`) lets query
``i`` of a segment see, among the segment's new keys, a prefix ``[0, hi)``, at most one more window
``[win_lo, win_hi)`` and, with ``self``, key ``i`` (drafts: a prefix; the AR lead: a prefix and itself;
2L verification: ``[0, s)`` and itself; fused pre-draft groups: the visible first half and the group;
scoring: the prefix, the branch's window and itself). :class:`MaskSpec` holds those four numbers a
query as int tensors, so a forward's masks cost ``4 x tokens`` integers, not ``n x n`` booleans a row,
and a kernel evaluates them in registers. :func:`spec_of` converts a boolean mask and raises
:class:`MaskDoesNotFit` when one does not fit this form; :func:`dense` is its inverse (for tests and the
reference path); :func:`canonical` gives the layouts' integer descriptions :func:`spec_of`'s exact form
without any ``n x n`` matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


class MaskDoesNotFit(ValueError):
    """A boolean mask that is not, per query, a prefix plus one window plus itself."""


@dataclass(frozen=True)
class MaskSpec:
    """Per query ``i`` of a segment (each ``[n]``, int64): it sees new keys ``[0, hi)``, ``[win_lo,
    win_hi)`` (empty when ``win_lo == win_hi``) and, where ``self_`` (bool), key ``i``."""

    hi: torch.Tensor
    win_lo: torch.Tensor
    win_hi: torch.Tensor
    self_: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.hi.numel())

    @functools.cached_property
    def host(self) -> np.ndarray:
        """The four fields as one int64 array ``[4, n]`` (``self_`` as 0/1), made once per spec (the
        layouts memoise theirs): what a forward's batch description concatenates."""
        return np.stack([self.hi.numpy(), self.win_lo.numpy(), self.win_hi.numpy(),
                         self.self_.numpy()]).astype(np.int64)  # fmt: skip


def spec_of(mask: torch.Tensor) -> MaskSpec:
    """The :class:`MaskSpec` of a boolean ``[n, n]`` mask (True = query row may see key column); raises
    :class:`MaskDoesNotFit` naming the first query whose visible keys take more than a prefix, one
    window and itself. Computed in numpy (host bookkeeping, no tensor ops)."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1] or mask.dtype != torch.bool:
        raise MaskDoesNotFit(f"a mask is a square boolean matrix, got {tuple(mask.shape)} {mask.dtype}")
    m = mask.numpy()
    n = m.shape[0]
    col = np.arange(n)
    hi = np.cumprod(m, axis=1).sum(axis=1)  # the leading run of visible keys
    rest = m & (col[None, :] >= hi[:, None]) & (col[None, :] != col[:, None])
    any_rest = rest.any(axis=1)
    win_lo = np.where(any_rest, rest.argmax(axis=1), hi)
    win_hi = np.where(any_rest, n - rest[:, ::-1].argmax(axis=1), hi)
    self_ = m.diagonal() & (col >= hi) & ~((col >= win_lo) & (col < win_hi))
    spec = MaskSpec(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (hi, win_lo, win_hi)),
                    torch.from_numpy(np.ascontiguousarray(self_)))  # fmt: skip
    seen = col[None, :] < hi[:, None]
    seen |= (col[None, :] >= win_lo[:, None]) & (col[None, :] < win_hi[:, None])
    seen |= self_[:, None] & (col[None, :] == col[:, None])
    bad = (seen != m).any(axis=1)
    if bad.any():
        q = int(bad.argmax())
        raise MaskDoesNotFit(
            f"query {q} of a {n}-token mask sees keys {np.flatnonzero(m[q]).tolist()}: "
            "more than a prefix, one window and itself"
        )
    return spec


def canonical(hi: np.ndarray, win_lo: np.ndarray, win_hi: np.ndarray, self_: np.ndarray) -> MaskSpec:
    """The :class:`MaskSpec` that :func:`spec_of` gives the mask in which query ``i`` sees keys ``[0, hi)``,
    ``[win_lo, win_hi)`` (empty when ``win_lo >= win_hi``) and, where ``self_``, key ``i`` (each ``[n]``):
    the leading run of visible keys as ``hi``, the other visible keys but ``i`` as the window, ``i`` alone
    as ``self_``. Numpy on ``4 x n`` integers: no ``n x n`` mask is made."""
    hi, lo, whi = (np.asarray(a, dtype=np.int64) for a in (hi, win_lo, win_hi))
    own = np.asarray(self_, dtype=bool)
    i = np.arange(hi.size, dtype=np.int64)
    win = lo < whi
    run = hi
    for _ in range(2):  # the window and the query itself each join the leading run at most once
        run = np.where(win & (lo <= run), np.maximum(run, whi), run)
        run = np.where(own & (i == run), run + 1, run)
    a = np.maximum(lo, run)  # the visible keys past the run but ``i``: [a, whi) less {i}
    rest = win & (whi - a - ((a <= i) & (i < whi)) > 0)
    first = np.where(rest, np.where(a == i, a + 1, a), run)
    last = np.where(rest, np.where(whi - 1 == i, whi - 1, whi), run)
    sees_self = own | (i < hi) | (win & (lo <= i) & (i < whi))
    alone = sees_self & (i >= run) & ~((first <= i) & (i < last))
    return MaskSpec(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (run, first, last, alone)))


def dense(spec: MaskSpec) -> torch.Tensor:
    """The boolean ``[n, n]`` mask of ``spec`` (the inverse of :func:`spec_of`)."""
    n = spec.n
    col = torch.arange(n)[None, :]
    q = torch.arange(n)[:, None]
    seen = col < spec.hi[:, None]
    seen |= (col >= spec.win_lo[:, None]) & (col < spec.win_hi[:, None])
    seen |= spec.self_[:, None] & (col == q)
    return seen


class SpecCache:
    """:func:`spec_of` once per mask object, for callers that describe segments by boolean masks they
    memoise (read-only tensors shared by rows; the layouts build specs directly), or any other conversion
    once per object (``convert``). Holds each mask it converted (so an id is
    never reused while cached) and forgets everything past ``size`` entries."""

    def __init__(self, size: int = 8192):
        self.size = size
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def get(self, mask: Any, convert: Callable[[Any], Any] | None = None) -> Any:
        """The mask's spec, or None when it does not fit (the caller takes the dense path); with
        ``convert``, ``convert(mask)`` once per object instead (never None unless it returns None)."""
        hit = self._by_id.get(id(mask))
        if hit is not None and hit[0] is mask:
            return hit[1]
        if convert is not None:
            out = convert(mask)
        else:
            try:
                out = spec_of(mask)
            except MaskDoesNotFit:
                out = None
        if len(self._by_id) >= self.size:
            self._by_id.clear()
        self._by_id[id(mask)] = (mask, out)
        return out

"""Key/value memory in fixed-size pages: one pool per engine, a page table per row.

:class:`KVPool` holds per-layer buffers ``[kv_heads, num_pages + 1, page_size, head_dim]`` (head-major:
a run of consecutive pages is, for every head, one stretch of positions, so a row whose pages are
consecutive is read as a view). Position ``p`` of a row lives in page ``table[p // page_size]`` at offset
``p % page_size``; storage page 0 is a page of zeros that no row owns (padding reads it, so every key a
padded query sees is finite). Which
page holds what is decided by a :class:`~s2d2.forward.kv_pages.PagePool` (page tables, reference
counts, the prefix cache); a row takes pages as it grows and gives them back when it retires.

A pool is either bounded (``max_pages``: the engine's KV budget, ``ensure`` raises
:class:`~s2d2.forward.kv_pages.OutOfPages` when it is spent) or grows on demand by doubling (a host
pool reserves what its rows may hold at once instead: :func:`host_reservation`).
A :class:`KVState` is a row's view of the pool: its key in the page pool and its cached length.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .kv_pages import PagePool

#: positions a page holds unless the engine says otherwise (divides every family's block size)
DEFAULT_PAGE_SIZE = 16
#: storage page of page-pool page ``p``: ``p + 1`` (storage page 0 is the zero page no row owns)
STORAGE_PAGE_OFFSET = 1
#: most of the host's memory an unbounded host pool reserves up front (:func:`host_reservation`)
HOST_RESERVATION_SHARE = 0.25


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of zeros. On the host it is numpy's (``calloc``): the operating system maps zero pages
    and touches memory only where it is written, so a pool that grows pays for the pages its rows use,
    not for the whole new storage at once. Other devices fill it (a fast memset there)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(shape, dtype={1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[size])
    return torch.from_numpy(raw).view(dtype)


def host_reservation(tokens: int, position_bytes: int, device: torch.device) -> int:
    """How many of ``tokens`` positions an unbounded pool takes at once: on the host all of them, up to
    :data:`HOST_RESERVATION_SHARE` of the machine's memory (:func:`zeroed` storage costs only where it is
    written, and growing copies the whole storage); on other devices none (memory there is taken as it
    is filled, so the pool starts small and doubles)."""
    if torch.device(device).type != "cpu" or tokens <= 0:
        return 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX host: no reservation
        return 0
    return min(tokens, int(memory * HOST_RESERVATION_SHARE) // max(position_bytes, 1))


@dataclass(slots=True)
class KVState:
    """One row's decoding state owned by an adapter: its cache, the cached length, family extras.

    ``cache`` is the :class:`KVPool` the row lives in (lean forward) or a transformers ``DynamicCache``
    (transformers' own forward); ``slot`` is the row's key in the pool's page tables.
    """

    cache: Any
    length: int = 0
    slot: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: positions the row's pages cover (paged pools; kept by :meth:`KVPool.ensure`)
    capacity: int = 0

    def advance(self, n: int) -> None:
        """``n`` more positions are cached: the one place a row's cached length grows."""
        self.length += n


class KVPool:
    """Paged per-layer key/value buffers shared by the rows of one engine (see the module docstring)."""

    def __init__(
        self,
        n_layers: int,
        n_kv: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_pages: int | None = None,
        tokens: int = 256,
        reserve_tokens: int | None = None,
    ):
        if page_size < 1:
            raise ValueError(f"kv_page_size must be >= 1, got {page_size}")
        if max_pages is not None and max_pages < 1:
            raise ValueError(f"a KV pool needs at least one page, got {max_pages}")
        self.shape = (n_layers, n_kv, head_dim)
        #: the pool's number in its tensor-parallel group's messages (0: never announced, one process)
        self.tp_id = 0
        self.dtype, self.device = dtype, device
        self.page_size = page_size
        self.max_pages = max_pages
        if max_pages is None:
            tokens = max(tokens, host_reservation(reserve_tokens or 0, self._position_bytes(), device))
        first = max_pages if max_pages is not None else max(4, math.ceil(tokens / page_size))
        self.pages = PagePool(first, page_size)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._allocate(first)
        self._slots = itertools.count()
        self._live: set[int] = set()

    def _position_bytes(self) -> int:
        n_layers, n_kv, hd = self.shape
        return 2 * n_layers * n_kv * hd * torch.empty((), dtype=self.dtype).element_size()

    @property
    def bounded(self) -> bool:
        return self.max_pages is not None

    @property
    def rows_in_use(self) -> int:
        return len(self._live)

    def _allocate(self, num_pages: int) -> None:
        """Storage for ``num_pages`` pages (plus the zero page), keeping what the old storage held."""
        n_layers, n_kv, hd = self.shape
        old = self.k[0].shape[1] if self.k else 0

        def grow(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            shape = (n_kv, num_pages + 1, self.page_size, hd)
            new = [zeroed(shape, self.dtype, self.device) for _ in range(n_layers)]
            for dst, src in zip(new, tensors, strict=False):
                dst[:, :old] = src
            return new

        self.k, self.v = grow(self.k), grow(self.v)

    # ------------------------------------------------------------------ rows
    def new_state(self) -> KVState:
        """A new, empty row (it takes pages as it grows)."""
        slot = next(self._slots)
        self._live.add(slot)
        return KVState(cache=self, length=0, slot=slot)

    def release(self, state: KVState) -> None:
        """Give a retired (or preempted) row's pages back; its state is emptied."""
        if state.slot in self.pages:
            self.pages.release(state.slot)
        self._live.discard(state.slot)
        state.length = state.capacity = 0
        state.extra.clear()

    def can_hold(self, state: KVState, length: int) -> bool:
        return length <= state.capacity or not self.bounded or self.pages.can_ensure(state.slot, length)

    def ensure(self, state: KVState, length: int) -> None:
        """Pages for positions ``[0, length)`` of ``state``'s row: a bounded pool raises
        :class:`~s2d2.forward.kv_pages.OutOfPages` (taking nothing) when its budget cannot cover
        them; an unbounded one grows."""
        if length <= state.capacity:
            return
        need = self.pages.pages_needed(state.slot, length)
        if need > self.pages.pages_available and not self.bounded:
            target = max(2 * self.pages.num_pages, self.pages.num_pages + need)
            self.pages.grow(target)
            self._allocate(target)
        self.pages.ensure(state.slot, length)
        state.capacity = self.pages.pages_held(state.slot) * self.page_size

    def adopt(self, state: KVState, pages: list[int]) -> None:
        """Start the empty row ``state`` with the prefix-cache ``pages`` (from ``pages.match``); its
        cached length advances over them."""
        n = self.pages.adopt(state.slot, pages)
        state.capacity = n
        state.advance(n)

    def table(self, state: KVState) -> list[int]:
        """The row's storage pages in order (page ``i`` holds positions ``[i * page_size, ...)``)."""
        return [p + STORAGE_PAGE_OFFSET for p in self.pages.table(state.slot)]

    def held_tables(self, states: Sequence[KVState]) -> list[list[int]]:
        """The rows' page tables as the page pool holds them (no copies: read them at once, never modify
        them), in page-pool numbering: storage page = entry + :data:`STORAGE_PAGE_OFFSET`."""
        return self.pages.held_tables([s.slot for s in states])

    def stats(self) -> dict[str, float]:
        """Page counters of the pool (:meth:`PagePool.stats`) and its size."""
        return {**self.pages.stats(), "kv_pages_total": self.pages.num_pages, "kv_page_size": self.page_size}


class PagesNotHeld(RuntimeError):
    """A forward was given a row whose pages do not cover its new positions (the scheduler, or
    :func:`take_pages`, takes them before the forward)."""


def take_pages(segments: Sequence[Any]) -> None:
    """Pages for each segment's positions ``[0, length + n)`` in its row's pool (paged rows only): for
    callers outside the engine, whose scheduler takes them; a bounded pool raises ``OutOfPages``."""
    for s in segments:
        if isinstance(s.state.cache, KVPool):
            s.state.cache.ensure(s.state, s.state.length + s.n)


def check_pages(segments: Sequence[Any]) -> None:
    """Raise :class:`PagesNotHeld` unless every segment's row holds pages for ``[0, length + n)``: the
    forward writes into pages it is given and takes none."""
    for s in segments:
        st = s.state
        if st.length + s.n > st.capacity:
            raise PagesNotHeld(
                f"row {st.slot} holds pages for {st.capacity} positions, its forward needs "
                f"{st.length + s.n}: pages are taken before the forward"
            )

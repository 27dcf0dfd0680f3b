"""Key/value memory with a row dimension: one pool per engine, one slot per running row.

:class:`KVPool` holds per-layer buffers ``[row_capacity, kv_heads, token_capacity, head_dim]`` that grow
on demand (doubling). A row takes a slot when it is admitted and gives it back when it retires; a
:class:`KVState` is a row's view of the pool: its slot and how many positions of it are filled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class KVState:
    """One row's decoding state owned by an adapter: its cache, the cached length, family extras.

    ``cache`` is the :class:`KVPool` the row lives in (lean forward) or a transformers ``DynamicCache``
    (transformers' own forward); ``slot`` is the row's index in the pool.
    """

    cache: Any
    length: int = 0
    slot: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def advance(self, n: int) -> None:
        """``n`` more positions are cached: the one place a row's cached length grows."""
        self.length += n


class KVPool:
    """Per-layer key/value buffers with a row (slot) dimension and per-row lengths."""

    def __init__(
        self,
        n_layers: int,
        n_kv: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        rows: int = 1,
        tokens: int = 256,
    ):
        self.shape = (n_layers, n_kv, head_dim)
        self.dtype, self.device = dtype, device
        self.row_capacity = 0
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._free: list[int] = []
        self._used: set[int] = set()
        self.ensure(rows, tokens)

    # ------------------------------------------------------------------ memory
    def ensure(self, rows: int, tokens: int) -> None:
        """Grow (by doubling) to hold at least ``rows`` slots of ``tokens`` positions each."""
        if rows <= self.row_capacity and tokens <= self.capacity:
            return
        new_rows = self.row_capacity if rows <= self.row_capacity else max(rows, 2 * self.row_capacity)
        new_cap = self.capacity if tokens <= self.capacity else max(tokens, 2 * self.capacity)
        n_layers, n_kv, hd = self.shape

        def grow(old: list[torch.Tensor]) -> list[torch.Tensor]:
            # zeros, not empty: a padded query may look at a slot's first key, which must be finite
            new = [
                torch.zeros(new_rows, n_kv, new_cap, hd, dtype=self.dtype, device=self.device)
                for _ in range(n_layers)
            ]
            for dst, src in zip(new, old, strict=False):
                dst[: self.row_capacity, :, : self.capacity] = src
            return new

        self.k, self.v = grow(self.k), grow(self.v)
        self._free += list(range(self.row_capacity, new_rows))
        self.row_capacity, self.capacity = new_rows, new_cap

    def reserve_rows(self, rows: int) -> None:
        """Make room for ``rows`` rows at once (one growth for a burst of admissions, not one a doubling)."""
        if rows > self.row_capacity:
            self.ensure(rows, self.capacity)

    @property
    def rows_in_use(self) -> int:
        return len(self._used)

    # ------------------------------------------------------------------ slots
    def new_state(self) -> KVState:
        """Take a free slot (growing the pool if none is free) for a new row."""
        if not self._free:
            self.ensure(self.row_capacity + 1, self.capacity)
        slot = min(self._free)
        self._free.remove(slot)
        self._used.add(slot)
        return KVState(cache=self, length=0, slot=slot)

    def release(self, state: KVState) -> None:
        """Give a retired row's slot back."""
        if state.slot in self._used:
            self._used.discard(state.slot)
            self._free.append(state.slot)
        state.length = 0
        state.extra.clear()

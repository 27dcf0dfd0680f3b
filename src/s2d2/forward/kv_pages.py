"""Paged KV bookkeeping: a pool of fixed-size pages, per-row page tables and a prefix cache.

This module only decides WHICH page holds which positions; it owns no tensors. The engine's KV tensors
are laid out as ``num_pages`` pages of ``page_size`` positions, and position ``p`` of a row lives in
page ``table(row)[p // page_size]`` at offset ``p % page_size``.

Every page is in exactly one of three states:

- **used**: referenced by at least one row's page table (``ref > 0``); never freed or handed out;
- **cached**: referenced by no row but holding a published prefix; reusable by :meth:`PagePool.match`,
  evicted least recently used (the tail of a released chain before its head) when free pages run out,
  except that a growing row evicts the page after its last one first (its pages stay consecutive);
- **free**: holding nothing.

So ``pages_used + pages_cached + pages_free == num_pages`` at all times.

Prefix cache. Only FULL pages of committed positions (keys and values that will not change) are shared.
A published page is indexed by its chain digest, a 128-bit BLAKE2b hash of (the previous page's digest,
its ``page_size`` token ids); the first page's parent is a root made for each ``cache_key`` (any hashable
naming what makes keys and values differ: cache kind, family, block alignment), so equal token prefixes
under different ``cache_key`` never share pages (roots are compared exactly; a digest collision is a
~2**-128 event). A digest names content, not a page: when two rows computed the same prefix, one page is
indexed and the other stays a private copy that takes over the index once the indexed page is no longer
referenced. A shared page is read-only: rows write only past the positions they adopted.

Preemption is by recompute: :meth:`PagePool.preempt` frees a row's pages (its published pages stay
cached while unreferenced) and returns its cached length; the scheduler keeps the tokens and later
re-admits the row with ``match`` / ``adopt`` / ``ensure`` and prefills what was not matched.

The tensors live in :class:`~s2d2.forward.kv_pool.KVPool`; the engine's scheduler decides admission,
preemption and publishing with this bookkeeping.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

#: the table of a row the pool does not know (:meth:`PagePool.held_tables`; never modified)
_NO_PAGES: list[int] = []


def _chain(parent: bytes, token_ids: Sequence[int], start: int, size: int) -> bytes:
    """The digest of the page holding ``token_ids[start:start + size]`` after ``parent``."""
    page = token_ids[start:start + size]
    try:  # ints, and integer tensors/numpy arrays, straight into the array: they hash like lists
        tokens = array("q", page)
    except TypeError:
        tokens = array("q", [int(t) for t in page])
    return hashlib.blake2b(parent + tokens.tobytes(), digest_size=16).digest()


class OutOfPages(RuntimeError):
    """``ensure`` needed more pages than free + cached ones; nothing was allocated."""

    def __init__(self, row: Hashable, needed: int, available: int):
        super().__init__(f"out of KV pages: row {row!r} needs {needed} more page(s), {available} available")
        self.row, self.needed, self.available = row, needed, available


@dataclass
class _Page:
    ref: int = 0
    digest: bytes | None = None  # its chain digest while published (indexed), else None
    parent: bytes = b""  # the previous page's digest, or the root, while published


@dataclass
class _Row:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # positions the row asked for (``ensure``), never shrinks
    digests: list[bytes] = field(default_factory=list)  # chain digests of its leading chained pages
    copies: list[int] = field(default_factory=list)  # chained pages that are private copies of indexed ones
    cache_key: Hashable | None = None


@dataclass(frozen=True)
class Preemption:
    """What re-admitting a preempted row needs: its cached length (its tokens stay with the scheduler)."""

    row: Hashable
    n_positions: int
    n_pages_freed: int


class PagePool:
    """``num_pages`` pages of ``page_size`` positions shared by rows, with a prefix cache.

    Rows are any hashables (request ids). Counters: ``pages_used``, ``pages_free``, ``pages_cached``,
    ``evictions``, ``preemptions``, ``lookup_positions`` / ``hit_positions`` (``prefix_hit_rate``).
    """

    def __init__(self, num_pages: int, page_size: int = 16):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        self._pages = [_Page() for _ in range(num_pages)]
        self._free: set[int] = set(range(num_pages))
        self._free_heap: list[int] = list(range(num_pages))  # a min-heap over _free (stale ids skipped)
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced published pages, LRU first
        self._index: dict[bytes, int] = {}  # chain digest -> page id
        self._roots: dict[Hashable, bytes] = {}  # cache_key -> its root digest
        self._root_keys: dict[bytes, Hashable] = {}
        self._rows: dict[Hashable, _Row] = {}
        self.evictions = self.preemptions = 0
        self.lookup_positions = self.hit_positions = 0

    def grow(self, num_pages: int) -> None:
        """Hold ``num_pages`` pages in all (the new ones are free); a smaller number is a no-op."""
        if num_pages > self.num_pages:
            self._pages += [_Page() for _ in range(num_pages - self.num_pages)]
            for pid in range(self.num_pages, num_pages):
                self._give_back(pid)
            self.num_pages = num_pages

    # ---- counters -------------------------------------------------------------------------------
    @property
    def pages_free(self) -> int:
        return len(self._free)

    @property
    def pages_cached(self) -> int:
        return len(self._cached)

    @property
    def pages_used(self) -> int:
        return self.num_pages - len(self._free) - len(self._cached)

    @property
    def pages_available(self) -> int:
        """Pages ``ensure`` can take: free ones plus cached ones it may evict."""
        return len(self._free) + len(self._cached)

    @property
    def prefix_hit_rate(self) -> float:
        """Positions reused / prompt positions looked up (0.0 before any lookup)."""
        return self.hit_positions / self.lookup_positions if self.lookup_positions else 0.0

    def stats(self) -> dict[str, float]:
        return {"kv_pages_used": self.pages_used, "kv_pages_free": self.pages_free,
                "kv_pages_cached": self.pages_cached, "prefix_hit_rate": self.prefix_hit_rate,
                "evictions": self.evictions, "preemptions": self.preemptions}

    # ---- rows -----------------------------------------------------------------------------------
    def __contains__(self, row: Hashable) -> bool:
        return row in self._rows

    def table(self, row: Hashable) -> list[int]:
        """A copy of ``row``'s page table (``[]`` for an unknown row)."""
        return list(self._rows[row].pages) if row in self._rows else []

    def held_tables(self, rows: Sequence[Hashable]) -> list[list[int]]:
        """Each of ``rows``' page table as the pool holds it (its own lists, no copies: read them within
        the caller's step and never modify them; ``[]`` for an unknown row)."""
        held, none = self._rows, _NO_PAGES
        return [r.pages if (r := held.get(row)) is not None else none for row in rows]

    def pages_held(self, row: Hashable) -> int:
        """How many pages ``row``'s table holds (0 for an unknown row)."""
        return len(self._rows[row].pages) if row in self._rows else 0

    def length(self, row: Hashable) -> int:
        """Positions ``row`` holds pages for as asked (``ensure``/``adopt``; 0 for an unknown row)."""
        return self._rows[row].length if row in self._rows else 0

    def ref_count(self, page: int) -> int:
        return self._pages[page].ref

    def pages_needed(self, row: Hashable, length: int) -> int:
        """How many more pages ``ensure(row, length)`` would take."""
        have = len(self._rows[row].pages) if row in self._rows else 0
        return max(0, math.ceil(length / self.page_size) - have)

    def can_ensure(self, row: Hashable, length: int) -> bool:
        return self.pages_needed(row, length) <= self.pages_available

    def ensure(self, row: Hashable, length: int) -> list[int]:
        """Give ``row`` pages for positions ``[0, length)``; returns the pages newly taken, in order.

        A new row is created on first use. All or nothing: raises :class:`OutOfPages` (and changes
        nothing) if free + cached pages cannot cover the growth. Free pages go first (the one after
        the row's last page if free, else the lowest), then cached ones are evicted: the one after the
        row's last page if cached, else the least recently used. A smaller ``length`` than before is
        a no-op.
        """
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        need = self.pages_needed(row, length)
        if need > self.pages_available:
            raise OutOfPages(row, need, self.pages_available)
        state = self._rows.setdefault(row, _Row())
        taken = []
        for _ in range(need):
            taken.append(self._take(state.pages[-1] if state.pages else None))
            state.pages.append(taken[-1])
        state.length = max(state.length, length)
        return taken

    def release(self, row: Hashable) -> int:
        """Drop ``row`` (finished or aborted) and unreference its pages; returns how many it held.

        A page whose count reaches 0 becomes cached if published, else free. Raises KeyError for a row
        this pool does not know.
        """
        state = self._rows.pop(row)
        for pid in reversed(state.pages):  # the tail enters the LRU first, so it is evicted first
            page = self._pages[pid]
            page.ref -= 1
            if page.ref == 0:
                if page.digest is not None:
                    self._cached[pid] = None
                else:
                    self._give_back(pid)
        return len(state.pages)

    def preempt(self, row: Hashable) -> Preemption:
        """Release ``row`` to make room; returns its cached length so the scheduler can recompute it."""
        n_positions = self._rows[row].length
        self.preemptions += 1
        return Preemption(row, n_positions, self.release(row))

    # ---- prefix cache ---------------------------------------------------------------------------
    def match(self, cache_key: Hashable, token_ids: Sequence[int], *, max_positions: int | None = None,
              multiple_of: int = 1, record: bool = True) -> tuple[list[int], int]:
        """The longest chain of cached full pages that starts ``token_ids`` under ``cache_key``.

        Returns ``(pages, n_positions)``, ``n_positions = len(pages) * page_size``, at most
        ``max_positions`` (e.g. ``len(prompt) - 1`` to keep a position to compute) and a multiple of
        ``multiple_of`` (e.g. the family's block size). Changes nothing but, with ``record``, the hit
        counters (pass ``record=False`` for a probe that may be repeated). Pass the pages to ``adopt``
        before any other call that may evict.
        """
        ps = self.page_size
        limit = len(token_ids) if max_positions is None else max(0, min(len(token_ids), max_positions))
        pages: list[int] = []
        parent = self._roots.get(cache_key)
        for start in range(0, limit - ps + 1 if parent is not None else 0, ps):
            parent = _chain(parent, token_ids, start, ps)
            pid = self._index.get(parent)
            if pid is None:
                break
            pages.append(pid)
        n = len(pages) * ps
        n -= n % math.lcm(ps, max(1, multiple_of))
        pages = pages[:n // ps]
        if record:
            self.lookup_positions += len(token_ids)
            self.hit_positions += n
        return pages, n

    def adopt(self, row: Hashable, pages: Sequence[int]) -> int:
        """Start the new (or empty) ``row`` with the matched ``pages``; returns the positions they hold.

        Raises ValueError, changing nothing, if ``row`` already has pages or ``pages`` is not (any more)
        a published chain from a root.
        """
        if self._rows.get(row, _Row()).pages:
            raise ValueError(f"row {row!r} already holds pages")
        chain = [self._pages[pid] for pid in pages]
        for i, (pid, page) in enumerate(zip(pages, chain, strict=True)):
            parent_ok = page.parent == chain[i - 1].digest if i else page.parent in self._root_keys
            if page.digest is None or self._index.get(page.digest) != pid or not parent_ok:
                raise ValueError(f"page {pid} is not a published continuation of the chain")
        state = self._rows.setdefault(row, _Row())
        for pid, page in zip(pages, chain, strict=True):
            page.ref += 1
            self._cached.pop(pid, None)
        state.pages, state.digests = list(pages), [page.digest for page in chain]
        state.length = max(state.length, len(pages) * self.page_size)
        if pages:
            state.cache_key = self._root_keys[chain[0].parent]
        return len(pages) * self.page_size

    def publish(
        self, row: Hashable, cache_key: Hashable, token_ids: Sequence[int], n_tokens: int | None = None
    ) -> int:
        """Register ``row``'s full pages of committed tokens for reuse; returns how many were new.

        ``token_ids`` are the row's committed tokens from position 0 (its first ``n_tokens``, when given:
        the rest is not read), whose keys and values are final in its pages; each call must extend the
        previous one's tokens (chained pages are not re-read).
        A page whose digest a referenced page already holds stays a private copy (and is indexed by a
        later call once that page is unreferenced or evicted); an unreferenced holder is replaced and
        freed. Raises ValueError if ``cache_key`` differs from the one the row adopted or published under.
        """
        state = self._rows[row]
        if not state.digests:
            state.cache_key = cache_key
        elif state.cache_key != cache_key:
            raise ValueError(f"row {row!r} is cached under {state.cache_key!r}, not {cache_key!r}")
        if cache_key not in self._roots:
            root = len(self._roots).to_bytes(16, "little")
            self._roots[cache_key], self._root_keys[root] = root, cache_key
        copies = [i for i in state.copies if not self._index_as(state, i)]
        new = len(state.copies) - len(copies)
        ps = self.page_size
        n = len(token_ids) if n_tokens is None else min(n_tokens, len(token_ids))
        for i in range(len(state.digests), min(n // ps, len(state.pages), state.length // ps)):
            state.digests.append(_chain(state.digests[i - 1] if i else self._roots[cache_key], token_ids,
                                        i * ps, ps))
            if self._index_as(state, i):
                new += 1
            else:
                copies.append(i)
        state.copies = copies
        return new

    def _index_as(self, state: _Row, i: int) -> bool:
        """Index the row's chained page ``i`` under its digest unless a referenced page holds it."""
        digest, holder = state.digests[i], self._index.get(state.digests[i])
        if holder is not None and self._pages[holder].ref > 0:
            return False
        if holder is not None:  # an unreferenced copy of the same content: ours replaces it
            del self._cached[holder]
            self._unpublish(holder)
        page = self._pages[state.pages[i]]
        page.digest, page.parent = digest, state.digests[i - 1] if i else self._roots[state.cache_key]
        self._index[digest] = state.pages[i]
        return True

    # ---- eviction -------------------------------------------------------------------------------
    def evict(self, n: int | None = None) -> int:
        """Evict up to ``n`` (all if None) cached pages, least recently used first; returns how many."""
        count = 0
        while self._cached and (n is None or count < n):
            self._evict_one()
            count += 1
        return count

    def _evict_one(self, pid: int | None = None) -> None:
        """Evict the cached page ``pid``, or the least recently used one."""
        if pid is None:
            pid, _ = self._cached.popitem(last=False)
        else:
            del self._cached[pid]
        self._unpublish(pid)
        self.evictions += 1

    def _unpublish(self, pid: int) -> None:
        """Drop the unreferenced, uncached page ``pid`` from the index and free it."""
        page = self._pages[pid]
        del self._index[page.digest]
        page.digest, page.parent = None, b""
        self._give_back(pid)

    def _give_back(self, pid: int) -> None:
        self._free.add(pid)
        heapq.heappush(self._free_heap, pid)
        if len(self._free_heap) > 4 * self.num_pages:  # ids taken out of order pile up: rebuild
            self._free_heap = sorted(self._free)

    def _take(self, after: int | None) -> int:
        """A page for a row whose last page is ``after`` (None: a row without pages), so that a row's
        pages stay consecutive where they can (read as one view instead of a gather): the page after
        ``after`` if it is free, else the lowest free page. When no page is free one cached page is
        evicted: the page after ``after`` if it is cached, else the least recently used."""
        nxt = None if after is None else after + 1
        if not self._free:
            self._evict_one(nxt if nxt in self._cached else None)
        if nxt in self._free:
            pid = nxt
        else:
            while self._free_heap[0] not in self._free:
                heapq.heappop(self._free_heap)
            pid = heapq.heappop(self._free_heap)
        self._free.remove(pid)
        self._pages[pid].ref = 1
        return pid

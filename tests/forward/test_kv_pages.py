"""The paged KV bookkeeping of issue 26: pages, page tables, the prefix cache, eviction and preemption."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import examples
from s2d2.forward.kv_pages import OutOfPages, PagePool, Preemption


def _row_with(pool: PagePool, row, key, tokens) -> list[int]:
    """A row that computed ``tokens`` itself and published them."""
    pool.ensure(row, len(tokens))
    pool.publish(row, key, tokens)
    return pool.table(row)


def test_validation():
    with pytest.raises(ValueError, match="page_size"):
        PagePool(4, page_size=0)
    with pytest.raises(ValueError, match="num_pages"):
        PagePool(0)
    assert PagePool(3).page_size == 16
    with pytest.raises(ValueError, match="length"):
        PagePool(3).ensure("r", -1)


def test_growth_at_page_boundaries():
    pool = PagePool(8, page_size=4)
    assert pool.ensure("r", 0) == [] and "r" in pool and pool.pages_used == 0
    first = pool.ensure("r", 1)
    assert len(first) == 1 and pool.pages_used == 1
    assert pool.ensure("r", 4) == []  # still inside the first page
    second = pool.ensure("r", 5)  # one past the boundary
    assert len(second) == 1 and second != first
    assert pool.ensure("r", 8) == [] and pool.ensure("r", 3) == []  # never shrinks
    assert pool.length("r") == 8 and len(pool.table("r")) == 2
    assert len(pool.ensure("r", 13)) == 2
    assert pool.table("r") == first + second + pool.table("r")[2:] and len(pool.table("r")) == 4
    assert len(set(pool.table("r"))) == 4 and pool.length("r") == 13
    assert (pool.pages_used, pool.pages_free, pool.pages_cached) == (4, 4, 0)
    assert pool.pages_needed("r", 17) == 1 and pool.pages_needed("new", 17) == 5


def test_held_tables_are_the_tables_without_copies():
    pool = PagePool(8, page_size=4)
    pool.ensure("a", 9)
    pool.ensure("b", 2)
    held = pool.held_tables(["b", "a", "unknown"])
    assert held == [pool.table("b"), pool.table("a"), []]
    pool.ensure("a", 13)  # the pool's own list: it shows the new page (callers read it at once)
    assert held[1] == pool.table("a") and len(held[1]) == 4


def test_a_growing_row_takes_the_page_after_its_last_one_where_it_can():
    pool = PagePool(8, page_size=4)
    assert pool.ensure("a", 8) == [0, 1]
    assert pool.ensure("b", 4) == [2]
    assert pool.ensure("a", 16) == [3, 4]  # its next page is taken: the lowest free one, then on from it
    assert pool.ensure("c", 4) == [5]
    pool.release("b")
    assert pool.ensure("d", 4) == [2]  # a new row starts at the lowest free page
    pool.release("a")
    assert pool.ensure("c", 16) == [6, 7, 0]  # on from page 5, then the lowest free one
    pool.release("c")
    pool.release("d")
    for _ in range(50):  # many out-of-order takes never hand out a page twice
        pool.ensure("e", 32)
        assert sorted(pool.table("e")) == list(range(8))
        pool.release("e")
    assert pool.pages_free == 8


def test_a_growing_row_evicts_the_cached_page_after_its_last_one_first():
    pool = PagePool(4, page_size=2)
    assert pool.ensure("x", 2) == [0]
    for row, tok in (("y", 5), ("w", 6), ("v", 7)):
        _row_with(pool, row, "k", [tok, tok])  # pages 1, 2, 3, published
    for row in ("v", "w", "y"):
        pool.release(row)  # least recently used first: 3, 2, 1
    assert pool.ensure("x", 4) == [1]  # page 1 follows x's page 0: evicted out of turn
    assert pool.match("k", [5, 5])[1] == 0 and pool.match("k", [7, 7])[1] == 2
    assert pool.ensure("new", 2) == [3]  # a new row evicts the least recently used
    assert pool.evictions == 2


def test_out_of_pages_is_all_or_nothing():
    pool = PagePool(4, page_size=4)
    pool.ensure("a", 12)
    table = pool.table("a")
    assert not pool.can_ensure("b", 8) and pool.can_ensure("b", 4)
    with pytest.raises(OutOfPages) as err:
        pool.ensure("b", 8)
    assert (err.value.needed, err.value.available) == (2, 1) and "out of KV pages" in str(err.value)
    assert "b" not in pool and (pool.pages_used, pool.pages_free) == (3, 1)
    with pytest.raises(OutOfPages):
        pool.ensure("a", 20)
    assert pool.table("a") == table and pool.length("a") == 12 and pool.pages_free == 1
    assert len(pool.ensure("a", 16)) == 1 and pool.pages_free == 0


def test_release_returns_private_pages_to_free():
    pool = PagePool(4, page_size=4)
    pool.ensure("a", 9)
    assert pool.release("a") == 3
    assert "a" not in pool and pool.table("a") == [] and pool.length("a") == 0
    assert (pool.pages_used, pool.pages_free, pool.pages_cached) == (0, 4, 0)
    assert len(pool.ensure("b", 16)) == 4  # every page came back
    with pytest.raises(KeyError):
        pool.release("a")


def test_match_zero_one_and_many_pages():
    pool = PagePool(16, page_size=4)
    tokens = list(range(12))
    table = _row_with(pool, "a", "k", tokens)
    assert pool.match("k", [9, 9, 9, 9, 9]) == ([], 0)
    assert pool.match("k", [0, 1, 2, 3, 7, 7, 7, 7]) == (table[:1], 4)
    assert pool.match("k", tokens + [50, 51]) == (table, 12)
    assert pool.match("k", tokens[:11]) == (table[:2], 8)  # a prompt ending mid-page
    assert pool.match("k", [0, 1, 2]) == ([], 0)


def test_only_full_pages_are_shared():
    pool = PagePool(16, page_size=4)
    assert pool.ensure("a", 10) and pool.publish("a", "k", list(range(10))) == 2
    assert pool.match("k", list(range(10))) == (pool.table("a")[:2], 8)
    assert pool.match("k", list(range(12))) == (pool.table("a")[:2], 8)
    pool.release("a")
    assert (pool.pages_cached, pool.pages_free) == (2, 14)  # the partial page went back to free
    # tokens beyond the pages the row holds are not published either
    pool.ensure("b", 4)
    assert pool.publish("b", "k", [7] * 12) == 1


def test_cache_key_separates_equal_prefixes():
    pool = PagePool(16, page_size=4)
    tokens = list(range(8))
    table = _row_with(pool, "a", ("block_causal", "sdar", 4), tokens)
    assert pool.match(("token_causal", "sdar", 4), tokens) == ([], 0)
    assert pool.match(("block_causal", "sdar", 8), tokens) == ([], 0)
    assert pool.match(("block_causal", "sdar", 4), tokens) == (table, 8)
    other = _row_with(pool, "b", ("token_causal", "sdar", 4), tokens)
    assert set(other).isdisjoint(table)
    assert pool.match(("token_causal", "sdar", 4), tokens) == (other, 8)


def test_numpy_tokens_key_like_lists():
    pool = PagePool(4, page_size=4)
    table = _row_with(pool, "a", "k", np.arange(8, dtype=np.int64))
    assert pool.match("k", list(range(8))) == (table, 8)


def test_adopt_shares_pages_and_new_growth_is_private():
    pool = PagePool(8, page_size=4)
    tokens = list(range(8))
    table = _row_with(pool, "a", "k", tokens)
    pages, n = pool.match("k", tokens + [8, 9])
    assert pool.adopt("b", pages) == 8 and pool.length("b") == 8
    assert [pool.ref_count(p) for p in table] == [2, 2] and pool.pages_used == 2
    fresh = pool.ensure("b", 10)
    assert len(fresh) == 1 and fresh[0] not in table and pool.ref_count(fresh[0]) == 1
    pool.release("a")
    assert [pool.ref_count(p) for p in table] == [1, 1] and pool.pages_cached == 0
    pool.release("b")
    assert (pool.pages_used, pool.pages_cached, pool.pages_free) == (0, 2, 6)
    # a row keeps publishing after the adopted chain: its own third page extends it
    pool.adopt("c", pool.match("k", tokens)[0])
    pool.ensure("c", 12)
    assert pool.publish("c", "k", tokens + [20, 21, 22, 23]) == 1
    assert pool.match("k", tokens + [20, 21, 22, 23])[1] == 12
    with pytest.raises(ValueError, match="cached under"):
        pool.publish("c", "other", tokens + [20, 21, 22, 23])
    with pytest.raises(ValueError, match="already holds"):
        pool.adopt("c", pages)


def test_adopt_refuses_stale_or_broken_chains():
    pool = PagePool(2, page_size=4)
    tokens = list(range(8))
    table = _row_with(pool, "a", "k", tokens)
    pool.release("a")
    pages, _ = pool.match("k", tokens)
    with pytest.raises(ValueError, match="not a published"):
        pool.adopt("b", pages[1:])  # does not start at a root
    with pytest.raises(ValueError, match="not a published"):
        pool.adopt("b", pages[::-1])
    pool.ensure("x", 4)  # evicts the tail page and reuses it
    with pytest.raises(ValueError, match="not a published"):
        pool.adopt("b", pages)
    assert "b" not in pool and pool.ref_count(table[0]) == 0 and pool.pages_cached == 1


def test_lru_eviction_order():
    pool = PagePool(4, page_size=2)
    prefixes = {name: [i, i] for i, name in enumerate("ABC")}
    for name, toks in prefixes.items():
        _row_with(pool, name, "k", toks)
    for name in ("A", "C", "B"):
        pool.release(name)
    assert (pool.pages_cached, pool.pages_free) == (3, 1)
    pool.ensure("x", 2)  # the free page first
    assert pool.evictions == 0 and pool.pages_cached == 3
    pool.ensure("y", 2)
    assert pool.evictions == 1 and pool.match("k", prefixes["A"])[1] == 0
    # using B makes it the most recently used: C goes next
    pool.adopt("b2", pool.match("k", prefixes["B"])[0])
    pool.release("b2")
    pool.ensure("z", 2)
    assert pool.match("k", prefixes["C"])[1] == 0 and pool.match("k", prefixes["B"])[1] == 2
    assert pool.evictions == 2 and pool.evict() == 1 and pool.evictions == 3
    assert pool.evict() == 0 and pool.pages_cached == 0


def test_a_released_chain_loses_its_tail_first():
    pool = PagePool(3, page_size=2)
    tokens = [1, 2, 3, 4, 5, 6]
    table = _row_with(pool, "a", "k", tokens)
    pool.release("a")
    assert pool.evict(1) == 1
    assert pool.match("k", tokens) == (table[:2], 4)
    assert pool.evict(1) == 1 and pool.match("k", tokens) == (table[:1], 2)


def test_referenced_pages_are_never_evicted():
    pool = PagePool(3, page_size=2)
    table = _row_with(pool, "a", "k", [1, 2, 3, 4])
    with pytest.raises(OutOfPages):
        pool.ensure("b", 4)  # one free page, nothing cached: the published pages are in use
    assert pool.evict() == 0 and pool.match("k", [1, 2, 3, 4]) == (table, 4)


def test_match_caps_and_alignment():
    pool = PagePool(8, page_size=4)
    tokens = list(range(16))
    table = _row_with(pool, "a", "k", tokens)
    assert pool.match("k", tokens) == (table, 16)
    assert pool.match("k", tokens, max_positions=15) == (table[:3], 12)
    assert pool.match("k", tokens, multiple_of=8) == (table, 16)
    assert pool.match("k", tokens[:14], multiple_of=8) == (table[:2], 8)
    assert pool.match("k", tokens, max_positions=15, multiple_of=8) == (table[:2], 8)
    assert pool.match("k", tokens, max_positions=-3) == ([], 0)


def test_hit_rate_accounting():
    pool = PagePool(8, page_size=4)
    assert pool.prefix_hit_rate == 0.0
    _row_with(pool, "a", "k", list(range(8)))
    pool.match("k", list(range(10)))  # 8 of 10 reused
    pool.match("k", [5] * 6)  # 0 of 6
    assert (pool.hit_positions, pool.lookup_positions) == (8, 16)
    pool.match("k", list(range(10)), record=False)
    assert pool.prefix_hit_rate == pytest.approx(0.5)
    stats = pool.stats()
    assert stats["prefix_hit_rate"] == pytest.approx(0.5) and stats["kv_pages_used"] == 2


def test_duplicate_prefix_stays_private_and_the_chain_goes_on():
    pool = PagePool(8, page_size=2)
    first = _row_with(pool, "a", "k", [1, 2, 3, 4])
    pool.ensure("b", 6)
    assert pool.publish("b", "k", [1, 2, 3, 4, 5, 6]) == 1  # only the third page is new
    second = pool.table("b")
    assert pool.match("k", [1, 2, 3, 4, 5, 6]) == (first + second[2:], 6)
    pool.release("b")
    assert (pool.pages_cached, pool.pages_free) == (1, 5)  # b's copies of the first two were freed


def test_a_private_copy_takes_over_the_index():
    pool = PagePool(6, page_size=2)
    first = _row_with(pool, "a", "k", [1, 2, 3, 4])
    pool.release("a")
    copy = _row_with(pool, "b", "k", [1, 2, 3, 4])  # recomputed without adopting (e.g. a capped match)
    assert pool.publish("b", "k", [1, 2, 3, 4]) == 0 and set(copy).isdisjoint(first)
    assert pool.match("k", [1, 2, 3, 4]) == (copy, 4)
    assert (pool.pages_used, pool.pages_cached, pool.pages_free) == (2, 0, 4)  # a's pages were freed
    # a referenced holder keeps the index; the copy takes it once the holder is evicted
    _row_with(pool, "c", "k", [1, 2, 3, 4, 5, 6])
    pool.release("b")
    pool.evict()
    assert pool.match("k", [1, 2, 3, 4, 5, 6])[1] == 0
    assert pool.publish("c", "k", [1, 2, 3, 4, 5, 6]) == 2
    assert pool.match("k", [1, 2, 3, 4, 5, 6]) == (pool.table("c"), 6)


def test_preempt_frees_pages_and_readmission_recomputes_the_rest():
    pool = PagePool(4, page_size=4)
    tokens = list(range(10))
    pool.ensure("a", 10)
    pool.publish("a", "k", tokens)
    out = pool.preempt("a")
    assert out == Preemption("a", 10, 3) and pool.preemptions == 1 and "a" not in pool
    assert (pool.pages_used, pool.pages_cached, pool.pages_free) == (0, 2, 2)
    pages, n = pool.match("k", tokens[:out.n_positions])
    assert n == 8 and pool.adopt("a", pages) == 8
    assert len(pool.ensure("a", out.n_positions)) == 1 and pool.pages_used == 3
    assert pool.stats()["preemptions"] == 1


# ---- property test ------------------------------------------------------------------------------------


@dataclass
class _Model:
    tokens: list[int]
    key: str
    written: int = 0  # positions whose keys/values this row has computed (or adopted)


class PagePoolMachine(RuleBasedStateMachine):
    """Random rows against an independent shadow of page tables, reference counts and page contents.

    The "KV store" records, per page slot, the (cache_key, token) a row computed there, so a reused
    prefix is checked to hold exactly the prompt it was matched for.
    """

    @initialize(n_pages=st.integers(1, 14), page_size=st.sampled_from([1, 2, 3, 4]),
                prefixes=st.lists(st.lists(st.integers(0, 2), max_size=14), min_size=1, max_size=3))
    def setup(self, n_pages, page_size, prefixes):
        self.pool = PagePool(n_pages, page_size)
        self.n, self.ps, self.prefixes = n_pages, page_size, prefixes
        self.rows: dict[int, _Model] = {}
        self.waiting: list[_Model] = []
        self.tables: dict[int, list[int]] = {}
        self.store: dict[int, list] = {}
        self.next_id = self.looked_up = self.reused = 0

    # -- helpers ---------------------------------------------------------------------------------------
    def _refs(self) -> Counter:
        return Counter(p for table in self.tables.values() for p in table)

    def _write(self, row: int) -> None:
        """Compute keys/values for the row's positions past ``written``: only into private pages."""
        model, table, refs = self.rows[row], self.tables[row], self._refs()
        for pos in range(model.written, len(model.tokens)):
            page = table[pos // self.ps]
            assert refs[page] == 1, "a row wrote into a page another row references"
            slots = self.store.setdefault(page, [None] * self.ps)
            slots[pos % self.ps] = (model.key, model.tokens[pos])
        model.written = len(model.tokens)

    def _grow(self, row: int) -> bool:
        before = (self.pool.table(row), self.pool.pages_free, self.pool.pages_cached)
        refs = self._refs()
        try:
            fresh = self.pool.ensure(row, len(self.rows[row].tokens))
        except OutOfPages:
            assert (self.pool.table(row), self.pool.pages_free, self.pool.pages_cached) == before
            return False
        assert all(refs[p] == 0 for p in fresh), "handed out a page that is still referenced"
        self.tables[row].extend(fresh)
        self._write(row)
        return True

    def _admit(self, model: _Model, cap: bool) -> None:
        row, self.next_id = self.next_id, self.next_id + 1
        cap_at = len(model.tokens) - 1 if cap else None
        pages, n = self.pool.match(model.key, model.tokens, max_positions=cap_at)
        assert n == len(pages) * self.ps <= len(model.tokens)
        self.looked_up, self.reused = self.looked_up + len(model.tokens), self.reused + n
        for i, page in enumerate(pages):  # the reused pages hold exactly this prompt's prefix
            expect = [(model.key, t) for t in model.tokens[i * self.ps:(i + 1) * self.ps]]
            assert self.store[page] == expect
        assert self.pool.adopt(row, pages) == n
        self.rows[row], self.tables[row] = model, list(pages)
        model.written = n
        if not self._grow(row):
            self._drop(row, preempted=False)
            model.written = 0
            self.waiting.append(model)

    def _publish(self, row: int) -> None:
        """Publish the row's computed tokens; at once, a lookup of them must find all its full pages."""
        model = self.rows[row]
        self.pool.publish(row, model.key, model.tokens[:model.written])
        full = min(model.written // self.ps, len(self.tables[row]))
        assert self.pool.match(model.key, model.tokens[:model.written], record=False)[1] == full * self.ps

    def _drop(self, row: int, preempted: bool) -> None:
        if preempted:
            out = self.pool.preempt(row)
            assert out.n_positions == self.rows[row].written and out.n_pages_freed == len(self.tables[row])
        else:
            assert self.pool.release(row) == len(self.tables[row])
        del self.rows[row], self.tables[row]

    # -- rules -----------------------------------------------------------------------------------------
    @rule(which=st.integers(0, 2), cut=st.integers(0, 14), suffix=st.lists(st.integers(0, 2), max_size=6),
          key=st.sampled_from(["a", "b"]), cap=st.booleans(), publish=st.booleans())
    def add(self, which, cut, suffix, key, cap, publish):
        tokens = self.prefixes[which % len(self.prefixes)][:cut] + suffix
        if tokens:
            self._admit(_Model(tokens, key), cap)
        if tokens and publish and self.next_id - 1 in self.rows:  # publish the prompt once computed
            self._publish(self.next_id - 1)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def grow(self, data, extra):
        row = data.draw(st.sampled_from(sorted(self.rows)))
        model = self.rows[row]
        model.tokens.extend(extra)
        if not self._grow(row):  # out of pages: preempt the row that asked, to recompute it later
            self._drop(row, preempted=True)
            self.waiting.append(_Model(model.tokens, model.key))

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def publish(self, data):
        self._publish(data.draw(st.sampled_from(sorted(self.rows))))

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), preempted=st.booleans())
    def retire(self, data, preempted):
        """Abort or finish (release), or preempt a row to re-admit it later by recompute."""
        row = data.draw(st.sampled_from(sorted(self.rows)))
        model = self.rows[row]
        self._drop(row, preempted)
        if preempted:
            self.waiting.append(_Model(model.tokens, model.key))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), cap=st.booleans())
    def readmit(self, data, cap):
        model = self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1)))
        self._admit(model, cap)

    @rule(n=st.integers(0, 3))
    def evict(self, n):
        cached = self.pool.pages_cached
        assert self.pool.evict(n) == min(n, cached)

    # -- invariants ------------------------------------------------------------------------------------
    @invariant()
    def counts_match_the_shadow(self):
        refs = self._refs()
        for row, table in self.tables.items():
            assert self.pool.table(row) == table
        assert all(self.pool.ref_count(p) == refs[p] for p in range(self.n))
        assert self.pool.pages_used == len(refs)
        assert self.pool.pages_used + self.pool.pages_free + self.pool.pages_cached == self.n
        assert (self.pool.lookup_positions, self.pool.hit_positions) == (self.looked_up, self.reused)
        shared = [p for p, c in refs.items() if c > 1]
        assert all(self.store.get(p) and None not in self.store[p] for p in shared), "shared a partial page"

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for row in list(self.rows):
            self._drop(row, preempted=False)
        assert self.pool.pages_used == 0
        assert self.pool.pages_free + self.pool.pages_cached == self.n
        self.pool.evict()
        assert (self.pool.pages_free, self.pool.pages_cached) == (self.n, 0)
        assert len(self.pool.ensure("all", self.n * self.ps)) == self.n


TestPagePoolMachine = PagePoolMachine.TestCase
TestPagePoolMachine.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])

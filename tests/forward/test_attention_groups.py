"""How the lean forward reads paged keys: a row's consecutive pages in place, scattered ones gathered,
and bit-equal logits either way (tiny-gsm, and the random SDAR model, whose attention is grouped-query)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import s2d2
from conftest import examples
from s2d2.forward import attention_groups
from s2d2.forward.kv_pool import take_pages
from s2d2.forward.segment import Segment


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


def _segment(state, ids: list[int]) -> Segment:
    n = len(ids)
    pos = torch.arange(state.length, state.length + n)
    mask = torch.ones(n, n, dtype=torch.bool).tril_()
    seg = Segment(state, torch.tensor(ids), pos, mask, keep=n, logit_rows=torch.arange(n))
    take_pages([seg])  # the engine's scheduler takes a row's pages before its forward
    return seg


def _prefill(fast, pool, state, ids: list[int]) -> None:
    fast.grouped_forward(pool, [_segment(state, ids)])
    state.advance(len(ids))


def _groups_seen(monkeypatch) -> list:
    seen: list = []
    build = attention_groups.build_groups

    def spy(*args):
        groups = build(*args)
        seen.extend(groups)
        return groups

    monkeypatch.setattr("s2d2.forward.fastpath.build_groups", spy)
    return seen


@pytest.mark.parametrize("model", ["tiny", "random_sdar"])
def test_consecutive_pages_are_read_in_place_and_give_the_gathered_logits(model, request, monkeypatch):
    fast = request.getfixturevalue(model).adapter.fast
    vocab = fast.lm_head.out_features
    ids = [int(t) for t in torch.randint(3, vocab, (60,), generator=torch.Generator().manual_seed(0))]
    pool = fast.new_pool(page_size=16)
    alone, interleaved = pool.new_state(), pool.new_state()
    _prefill(fast, pool, alone, ids[:40])  # pages 1-3, in order
    other = pool.new_state()
    for i in range(0, 40, 8):  # two rows growing in turns: their pages alternate
        _prefill(fast, pool, interleaved, ids[i:i + 8])
        _prefill(fast, pool, other, ids[i + 1:i + 9])
    assert attention_groups.consecutive(pool.table(alone))
    assert not attention_groups.consecutive(pool.table(interleaved))
    seen = _groups_seen(monkeypatch)
    query = ids[40:48]  # within the three pages it holds
    in_place = fast.grouped_forward(pool, [_segment(alone, query)])[0]
    gathered = fast.grouped_forward(pool, [_segment(interleaved, query)])[0]
    assert seen[0].pages is None and seen[1].pages is not None
    assert torch.allclose(in_place, gathered, atol=1e-4)  # its keys were computed 8 at a time
    monkeypatch.setattr(attention_groups, "consecutive", lambda pages: False)
    assert torch.equal(fast.grouped_forward(pool, [_segment(alone, query)])[0], in_place)
    assert seen[2].pages is not None
    batched = fast.grouped_forward(pool, [_segment(alone, query), _segment(interleaved, query[:5])])
    assert torch.allclose(batched[0], in_place, atol=1e-5)
    assert torch.allclose(batched[1], gathered[:5], atol=1e-5)


def test_groups_cover_whole_pages_and_mask_past_the_keys(tiny):
    fast = tiny.adapter.fast
    pool = fast.new_pool(page_size=16)
    state = pool.new_state()
    _prefill(fast, pool, state, list(range(3, 23)))  # 20 cached positions
    seg = _segment(state, [5, 6, 7])
    pool.ensure(state, state.length + seg.n)
    pages = pool.table(state)
    tables = torch.tensor([pages])
    (group,) = attention_groups.build_groups([seg], [pages], tables, 16, torch.float32, torch.device("cpu"))
    assert (group.n_rows, group.n_q, group.n_k) == (1, 3, 32)
    assert group.tokens is None and group.row is None and group.pages is None
    assert group.first_page == pages[0] and group.mask.shape == (1, 1, 3, 32)
    visible = group.mask[0, 0] == 0
    assert visible[:, :20].all() and not visible[:, 23:].any()
    assert visible[:, 20:23].equal(torch.ones(3, 3, dtype=torch.bool).tril_())


@pytest.mark.parametrize("length", [0, 5, 16, 37])
def test_the_one_row_mask_is_the_group_mask(tiny, length):
    pool = tiny.adapter.fast.new_pool(page_size=16)
    state = pool.new_state()
    state.length = length
    rng = torch.Generator().manual_seed(length)
    for n in (1, 2, 7, 31):
        seg = _segment(state, [5] * n)
        seg.mask = torch.rand(n, n, generator=rng) < 0.5
        n_k = -(-(length + n) // 16) * 16
        want = attention_groups.group_mask([seg], [0], 1, n, n_k)
        assert torch.equal(attention_groups.one_row_mask(seg, n_k), want)


def _shaped(tiny, shapes: list[tuple[int, int]]) -> list[Segment]:
    """Segments of ``(cached length, new tokens)``."""
    pool = tiny.adapter.fast.new_pool(page_size=16)
    out = []
    for length, n in shapes:
        state = pool.new_state()
        state.length = length
        out.append(_segment(state, [5] * n))
    return out


def test_rows_are_grouped_where_padding_them_together_costs_more_than_a_group(tiny):
    split = attention_groups.split_by_length
    assert split(_shaped(tiny, [(100, 2)] * 40)) == [list(range(40))]
    # a prefill chunk among decode rows
    decode_and_chunk = _shaped(tiny, [(100, 2)] * 8 + [(0, 256)])
    assert split(decode_and_chunk) == [list(range(8)), [8]]
    # drafts (17 tokens) beside verifications (31): apart when many rows with long contexts pad
    many = _shaped(tiny, [(300, 17), (300, 31)] * 16)
    assert split(many) == [list(range(0, 32, 2)), list(range(1, 32, 2))]
    assert split(_shaped(tiny, [(40, 17), (40, 31)])) == [[0, 1]]  # two short rows: one group
    # many distinct counts: every row in exactly one group, groups in order of their query counts
    mixed = _shaped(tiny, [(50 + 7 * i, 1 + (i * 5) % 23) for i in range(40)])
    groups = split(mixed)
    assert sorted(i for g in groups for i in g) == list(range(40))
    assert 1 < len(groups) <= attention_groups.MAX_BUCKETS
    sizes = [[mixed[i].n for i in g] for g in groups]
    assert all(max(a) <= min(b) for a, b in zip(sizes, sizes[1:], strict=False))


class _Cached:
    def __init__(self, length: int):
        self.length = length


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_the_group_mask_is_its_definition(data):
    """Entry by entry: a segment's valid query j sees its cached keys, and new key ``length + i`` where
    its mask allows (0, else -inf); padding queries and rows without a segment see key 0 only; a bias
    adds to what is visible. Random groups, with and without biases, shared masks and empty rows."""
    R = data.draw(st.integers(1, 6))
    segs = []
    for _ in range(R):
        n, length = data.draw(st.integers(1, 7)), data.draw(st.integers(0, 12))
        mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))).view(n, n)
        same = [s.mask for s in segs if s.n == n]
        if same and data.draw(st.booleans()):  # rows share memoised mask objects
            mask = same[0]
        biased = data.draw(st.booleans()) and data.draw(st.booleans())
        bias = torch.arange(n * n, dtype=torch.float32).view(n, n) / 10 if biased else None
        context_bias = 0.5 if biased and data.draw(st.booleans()) else 0.0
        segs.append(Segment(_Cached(length), [0] * n, list(range(n)), mask, n, None, bias=bias,
                            context_bias=context_bias))  # fmt: skip
    n_rows = R + data.draw(st.integers(0, 2))
    rows = data.draw(st.permutations(range(n_rows)))[:R]
    n_q = max(s.n for s in segs) + data.draw(st.integers(0, 2))
    n_k = max(s.state.length + s.n for s in segs) + data.draw(st.integers(0, 3))
    got = attention_groups.group_mask(segs, rows, n_rows, n_q, n_k)
    inf = float("-inf")
    want = torch.full((1, n_rows, n_q, n_k), inf)
    want[0, :, :, 0] = 0.0
    for seg, r in zip(segs, rows, strict=True):
        L, n = seg.state.length, seg.n
        for j in range(n_q):
            for key in range(n_k):
                if j >= n:
                    want[0, r, j, key] = 0.0 if key == 0 else inf
                elif key < L:
                    want[0, r, j, key] = seg.context_bias
                elif key < L + n and seg.mask[j, key - L]:
                    want[0, r, j, key] = 0.0 if seg.bias is None else float(seg.bias[j, key - L])
                else:
                    want[0, r, j, key] = inf
    assert got.dtype == torch.float32 and torch.equal(got, want)

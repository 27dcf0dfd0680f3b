"""Compact masks: every mask the adapters build is, per query, a prefix, one window and itself
(MaskSpec round trip); a mask that is not raises; the paged forward that reads them gives the grouped
forward's logits for mixed rows of every kind."""

from __future__ import annotations

import itertools

import pytest
import torch

import s2d2
from s2d2.forward import masks
from s2d2.forward.kv_pool import PagesNotHeld, take_pages
from s2d2.forward.masks import context_mask, score_mask
from s2d2.forward.segment import Predraft, Segment
from s2d2.layouts import family
from s2d2.layouts.mask_spec import MaskDoesNotFit, SpecCache, dense, spec_of


def _every_mask():
    for m, B, causal in itertools.product((0, 1, 3, 5), (4, 8), (False, True)):
        for committed in itertools.product((False, True), repeat=min(B, 4)):
            done = tuple(committed) + (False,) * (B - len(committed))
            for phase in (0, 1, B - 1):
                yield masks.draft_block_mask(m, done if causal else (False,) * B, B, causal, phase)
            if causal and False in done:
                yield masks.lead_mask(m, done, done.index(False))
    for n in (1, 2, 7, 16):
        yield masks.causal_mask(n)
        pos = torch.arange(3, 3 + n)
        yield context_mask(pos, pos, 4, False)
    for n_first, slots in ((4, (1, 2, 3)), (8, (0, 3, 7)), (5, (2,)), (16, tuple(range(1, 16, 2)))):
        yield masks.verify2l_mask(0, n_first, list(slots))
        for groups in (((2, 1, False),), ((3, 2, True), (1, 4, False)), ((4, n_first, True),)):
            yield masks.fused_mask(n_first, slots, groups)
    for p, frm, branches in ((4, 1, [2, 3]), (6, 0, [1]), (3, 2, [])):
        yield score_mask(p, frm, branches)


def test_every_adapter_mask_round_trips_through_its_spec():
    seen = 0
    for mask in _every_mask():
        spec = spec_of(mask)
        assert torch.equal(dense(spec), mask)
        seen += 1
    assert seen > 300


def test_a_mask_of_two_windows_does_not_fit():
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[5, [0, 2, 4, 5]] = True  # prefix [0, 1), windows {2} and {4}, itself
    mask[:5, 0] = True
    with pytest.raises(MaskDoesNotFit, match="query 5"):
        spec_of(mask)
    assert SpecCache().get(mask) is None
    with pytest.raises(MaskDoesNotFit, match="square boolean"):
        spec_of(torch.ones(2, 3, dtype=torch.bool))


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False, device="cpu")


def mixed_segments(fast, pool) -> list:
    """Segments of every kind on four rows of different cached lengths (prefilled on first call), one a
    row: a causal draft, a 2L verification, a fused verification with a pre-draft group, a prefill."""
    rows = getattr(pool, "_test_rows", None)
    if rows is None:
        rows = pool._test_rows = [pool.new_state() for _ in range(4)]
        gen = torch.Generator().manual_seed(0)
        for r, st in enumerate(rows):
            ids = torch.randint(3, 300, (8 + 9 * r,), generator=gen).tolist()
            seg = Segment(st, ids, list(range(len(ids))), masks.causal_mask(len(ids)), keep=len(ids),
                          logit_rows=Segment.last_rows(len(ids), 0))  # fmt: skip
            take_pages([seg])
            fast.forward(pool, [seg])
            st.advance(len(ids))
    mask_id, a, b, c, d = 2, *rows
    layout = HFLayout(mask_id)
    group = Predraft([9, mask_id], [c.length + 4, c.length + 5], 2, True)
    segments = [
        layout.draft(a, [5, mask_id, 7, mask_id]),
        layout.verify(b, [5, 6, 7, 8], [1, 2, 3]),
        layout.fused(c, [5, 6, 7, 8], [1, 3], [group]),
        Segment(d, [11, 12, 13], [d.length, d.length + 1, d.length + 2], masks.causal_mask(3), keep=0,
                logit_rows=torch.arange(3)),
    ]  # fmt: skip
    take_pages(segments)  # the forward writes into pages its rows hold (the engine's scheduler takes them)
    return segments


class HFLayout:
    """The tiny model's segment layouts without a model (:mod:`s2d2.layouts.family` needs only the
    family's traits)."""

    def __init__(self, mask_id: int):
        self.info = type("Info", (), {"mask_token_id": mask_id, "shifted": False, "prefill_bias": False})()

    def draft(self, st, block):
        return Segment.of(
            st, family.draft(self.info, st.length, [], block, start=st.length, block_size=4, causal=True)
        )

    def verify(self, st, filled, slots):
        return Segment.of(st, family.verify(self.info, st.length, filled, start=st.length, slots=slots))

    def fused(self, st, filled, slots, predrafts):
        lay = family.fused(self.info, st.length, filled, start=st.length, slots=slots, predrafts=predrafts)
        return Segment.of(st, lay)


def test_the_paged_forward_gives_the_grouped_forwards_logits_for_mixed_rows(tiny):
    fast = tiny.adapter.fast
    pool = fast.new_pool(page_size=16)
    paged = fast.forward(pool, mixed_segments(fast, pool))
    grouped = fast.grouped_forward(pool, mixed_segments(fast, pool))
    assert [p.shape for p in paged] == [g.shape for g in grouped]
    for p, g in zip(paged, grouped, strict=True):
        assert torch.allclose(p, g, atol=1e-4), (p - g).abs().max()
    alone = [fast.forward(pool, [s])[0] for s in mixed_segments(fast, pool)]
    for p, a in zip(paged, alone, strict=True):
        assert torch.allclose(p, a, atol=1e-5)


def test_a_segment_with_a_bias_takes_the_grouped_path(tiny, monkeypatch):
    fast = tiny.adapter.fast
    pool = fast.new_pool(page_size=16)
    st = pool.new_state()
    n = 4
    seg = Segment(st, [5, 6, 7, 8], list(range(n)), torch.ones(n, n, dtype=torch.bool), keep=n,
                  logit_rows=torch.arange(n), bias=torch.zeros(n, n))  # fmt: skip
    called = []
    monkeypatch.setattr(type(fast), "run_batch", lambda *a: called.append(1))
    take_pages([seg])
    out = fast.forward(pool, [seg])
    assert not called and out[0].shape == (n, fast.lm_head.out_features)


@pytest.mark.parametrize("path", ["forward", "grouped_forward"])
def test_the_forward_takes_no_page_and_advances_no_length(tiny, path):
    """Pages are the scheduler's (or :func:`take_pages`'s) to take, lengths the step's to advance: a
    row without pages is refused before anything runs, and a forward leaves its rows' states as they
    were."""
    fast = tiny.adapter.fast
    pool = fast.new_pool(page_size=16)
    st = pool.new_state()
    seg = Segment(st, [5, 6, 7], [0, 1, 2], masks.causal_mask(3), keep=3, logit_rows=torch.arange(3))
    with pytest.raises(PagesNotHeld, match="pages are taken before the forward"):
        getattr(fast, path)(pool, [seg])
    take_pages([seg])
    held = (st.length, st.capacity, pool.pages.stats())
    getattr(fast, path)(pool, [seg])
    assert (st.length, st.capacity, pool.pages.stats()) == held

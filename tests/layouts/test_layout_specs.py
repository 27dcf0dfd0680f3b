"""The layouts' visibility, built as integers, is exactly what the boolean oracle masks say: every kind
of segment over a grid of shapes gives :func:`spec_of` of the matrix the adapters built before (field by
field, the same canonical form), and :func:`canonical` agrees with :func:`spec_of` on any description."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from s2d2.forward import masks
from s2d2.layouts import layout, specs
from s2d2.layouts.mask_spec import MaskDoesNotFit, MaskSpec, canonical, dense, spec_of


def _same(got: MaskSpec, mask: torch.Tensor) -> None:
    want = spec_of(mask)
    for field in ("hi", "win_lo", "win_hi", "self_"):
        assert torch.equal(getattr(got, field), getattr(want, field)), (field, got, want)
    assert torch.equal(dense(got), mask)


def test_drafts_and_leads_match_the_oracle():
    seen = 0
    for m, B, causal in itertools.product((0, 1, 3, 5), (4, 8), (False, True)):
        for head in itertools.product((False, True), repeat=4):
            for fed in (B, B - 1, 2):  # a whole block, a block with one cached slot, a short tail
                done = (tuple(head) + (False,) * B)[:fed] if causal else (False,) * fed
                for phase in (0, 1, B - 1):
                    oracle = masks.draft_block_mask(m, done, B, causal, phase)
                    _same(specs.draft(m, done, B, causal, phase), oracle)
                    seen += 1
                if causal and False in done:
                    _same(specs.lead(m, done, done.index(False)), masks.lead_mask(m, done, done.index(False)))
                    seen += 1
    assert seen > 500


def test_prefills_commits_and_causal_rows_match_the_oracle():
    for n in (1, 2, 7, 16, 33):
        _same(specs.causal(n), masks.causal_mask(n))
        _same(specs.full(n), torch.ones(n, n, dtype=torch.bool))
        for start, B, causal in itertools.product((0, 3, 5, 16), (1, 4, 8), (False, True)):
            pos = torch.arange(start, start + n)
            _same(specs.context(n, start % B, B, causal), masks.context_mask(pos, pos, B, causal))


@pytest.mark.parametrize("n_first,slots", [(4, (1, 2, 3)), (8, (0, 3, 7)), (5, (2,)), (5, (5,)),
                                           (3, (0, 1, 3)), (16, tuple(range(1, 16, 2)))])  # fmt: skip
def test_verifications_and_fused_groups_match_the_oracle(n_first, slots):
    _same(specs.two_halves(n_first, slots, ()), masks.verify2l_mask(0, n_first, list(slots)))
    for groups in (((2, 1, False),), ((3, 2, True), (1, 4, False)), ((4, n_first, True),),
                   ((1, 0, True), (2, n_first, False)), ((2, 0, False), (3, n_first, True))):  # fmt: skip
        _same(specs.two_halves(n_first, slots, groups), masks.fused_mask(n_first, slots, groups))


@pytest.mark.parametrize("p,frm,branches", [(4, 1, (2, 3)), (6, 0, (1,)), (3, 2, ()), (3, 3, (2, 1)),
                                            (0, 0, (2,)), (5, 5, (1, 1, 4))])  # fmt: skip
def test_scoring_matches_the_oracle(p, frm, branches):
    _same(specs.score(p, frm, branches), masks.score_mask(p, frm, list(branches)))
    fed = tuple(b - 1 for b in branches)
    _same(specs.shifted_score(p, fed), masks.shifted_score_mask(p, fed))


def _descriptions(n: int):
    row = st.tuples(st.integers(0, n), st.integers(0, n), st.integers(0, n), st.booleans())
    return st.lists(row, min_size=n, max_size=n)


@given(st.integers(1, 12).flatmap(_descriptions))
def test_canonical_gives_spec_of_for_any_description(rows):
    n = len(rows)
    hi, lo, whi, own = (np.array(x) for x in zip(*rows, strict=True))
    col, q = np.arange(n)[None, :], np.arange(n)[:, None]
    seen = (col < hi[:, None]) | ((col >= lo[:, None]) & (col < whi[:, None])) | (own[:, None] & (col == q))
    _same(canonical(hi, lo, whi, own), torch.from_numpy(seen))


def test_a_layout_feeds_what_the_adapters_fed():
    """A partly cached causal draft with its AR lead: pending then the block's uncached slots then the
    lead's mask query; it keeps the pending tokens and (``extend``) the fed committed slots; logit rows
    are the fed slots and the lead, behind one zero row a cached slot."""
    lay = layout.draft(9, 10, [4, 5], [1, 2, 3, 9, 9], start=11, block_size=5, causal=True, cached=1,
                       extend=True, lead=3)  # fmt: skip
    assert lay.ids == [4, 5, 2, 3, 9, 9, 9] and lay.pos == [9, 10, 12, 13, 14, 15, 14]
    assert lay.keep == 2 + 2 and lay.zero_rows == 1 and lay.logit_rows.tolist() == [2, 3, 4, 5, 6]
    done = (True, True, False, False)
    _same(lay.spec, masks.lead_mask(2, done, 2))
    with pytest.raises(AssertionError, match="first masked slot"):
        layout.draft(9, 10, [4, 5], [1, 2, 3, 9, 9], start=11, block_size=5, causal=True, cached=1, lead=4)


def test_a_mask_that_does_not_fit_still_raises():
    mask = masks.causal_mask(6)
    mask[5, [1, 3]] = False  # query 5 sees [0, 1), {2}, {4} and itself: two windows
    with pytest.raises(MaskDoesNotFit, match="query 5"):
        spec_of(mask)

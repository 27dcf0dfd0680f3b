"""A shifted family's logit rows re-aligned by an index map: returned rows are raw rows or the row's
saved prediction, whatever the map's shape (a run, a run behind the saved row, anything else), and the
saved prediction is read from the row's state, the new one is the forward's output (``saves``) until the
row's writer keeps it; a missing one is a clear error."""

from __future__ import annotations

import pytest
import torch

from s2d2.forward.kv_pool import KVState
from s2d2.forward.segment import NEXT_LOGITS, Segment, realigned
from s2d2.layouts import specs
from s2d2.layouts.layout import Realign


def _segment(state: KVState) -> Segment:
    return Segment(state, [1, 2], [7, 8], specs.full(2), keep=2, logit_rows=torch.tensor([0, 1]))


@pytest.mark.parametrize("rows", [(0, 1, 2), (1, 2), (-1, 0, 1), (-1,), (2, 0), (-1, 3, 1), (0, -1), ()])
def test_each_returned_row_is_the_raw_row_or_the_saved_one(rows):
    raw = torch.arange(20.0).view(4, 5)
    state = KVState(cache=None, length=7)
    old = torch.full((5,), -1.0)
    state.extra[NEXT_LOGITS] = (7, old)
    seg = _segment(state)
    out = realigned(seg, Realign(rows, at=7, save_row=3, save_at=9))(raw)
    want = [old if i < 0 else raw[i] for i in rows]
    assert torch.equal(out, torch.stack(want) if want else raw[:0])
    assert state.extra[NEXT_LOGITS][1] is old  # the forward writes nothing to the row
    assert seg.saves is not None and seg.saves[0] == 9 and torch.equal(seg.saves[1], raw[3])
    seg.keep_prediction()  # the writer's call, after the forward
    assert state.extra[NEXT_LOGITS][0] == 9 and torch.equal(state.extra[NEXT_LOGITS][1], raw[3])


def test_no_saved_prediction_is_zeros_at_position_0_and_an_error_elsewhere():
    raw = torch.ones(2, 3)
    state = KVState(cache=None, length=0)
    seg = _segment(state)
    assert torch.equal(realigned(seg, Realign((-1, 0), at=0))(raw), torch.tensor([[0.0] * 3, [1.0] * 3]))
    with pytest.raises(RuntimeError, match="no saved prediction for position 4"):
        realigned(seg, Realign((-1, 0), at=4))(raw)

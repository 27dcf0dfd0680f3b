"""Host tensors from Python lists (``forward/host_lists.py``): the same values as ``torch.tensor``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from s2d2.forward.host_lists import long_tensor


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=300))
def test_long_tensor_equals_torch_tensor(values):
    got = long_tensor(values)
    assert got.dtype == torch.long and torch.equal(got, torch.tensor(values, dtype=torch.long))


def test_bools_nested_lists_and_overflow_behave_as_torch_tensor():
    assert torch.equal(long_tensor([True, False, 7]), torch.tensor([1, 0, 7]))
    assert torch.equal(long_tensor([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 4]]))  # torch's own path
    assert long_tensor([]).shape == (0,) and long_tensor([]).dtype == torch.long
    with pytest.raises((RuntimeError, ValueError)):
        long_tensor([2**70])


def test_the_tensor_outlives_the_list_it_was_made_from():
    t = long_tensor(list(range(5)))
    junk = [long_tensor([9] * 5) for _ in range(100)]  # reuse of freed buffers would show here
    assert t.tolist() == [0, 1, 2, 3, 4] and len(junk) == 100

"""Kernel-launching aten ops: views and no-ops are not counted, a layer of the paged forward takes at
most 20 whatever its rows, and a generation stays under 20 a layer plus 50 a step, the same within 10%
at one row and at many (drafting, verifying and fused rows mixed)."""

from __future__ import annotations

import pytest
import torch

import s2d2
from s2d2.bench.op_count import OpCounter, count_generate
from s2d2.bench.suites import load_problems
from s2d2.forward import fastpath


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False, device="cpu")


def test_views_and_no_ops_are_not_counted():
    x = torch.ones(4, 6)
    with OpCounter() as c:
        y = x.view(6, 4).reshape(24)[2:5]
        x.t().transpose(0, 1).squeeze()
        x.to(torch.float32)
        y.unsqueeze(0).expand(3, 3)
    assert c.total == 0
    with OpCounter() as c:
        (x * 2).add_(1).sum()
    assert dict(c.counts) == {"mul": 1, "add_": 1, "sum": 1}


def test_a_paged_layer_launches_at_most_20_ops_at_any_row_count(tiny, monkeypatch):
    per_call: list[int] = []
    real = fastpath.layer_forward

    def counted(*args, **kwargs):
        with OpCounter() as c:
            out = real(*args, **kwargs)
        per_call.append(c.total)
        return out

    monkeypatch.setattr(fastpath, "layer_forward", counted)
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 8)]
    for rows, config in ((1, "ar"), (8, "lossless-auto")):
        count_generate(tiny, prompts[: rows * 2], config, rows, max_new_tokens=16)
    assert per_call and max(per_call) <= 20 and min(per_call) == max(per_call)


@pytest.mark.parametrize("config", ["ar", "lossless-auto"])
def test_a_step_stays_under_20_ops_a_layer_plus_50_at_one_row_and_many(tiny, config):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 16)]
    one = count_generate(tiny, prompts[:3], config, 1, max_new_tokens=24)
    many = count_generate(tiny, prompts, config, 16, max_new_tokens=24)
    assert one.layers == 4 and one.forwards > 10 and many.forwards > 4
    for c in (one, many):
        assert c.per_forward <= 20 * c.layers + 50, c.top
    assert abs(many.per_forward / one.per_forward - 1) <= 0.1, (one.per_forward, many.per_forward)

"""The runner boundary: the engine's runner describes a step's forward as ONE host-side batch, the
adapter runs it and returns packed logits, and the runner splits them: each row gets exactly what the
adapter's own ``run`` gives (callers outside the engine), and segments no batch describes (a float bias)
take ``run``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import s2d2
from s2d2.engine.runner import ModelRunner
from s2d2.forward.forward_batch import ForwardBatch
from s2d2.forward.kv_pool import take_pages
from s2d2.forward.segment import Predraft, Segment
from s2d2.layouts import family


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False, device="cpu")


def mixed_segments(adapter, pool) -> list[Segment]:
    """One segment of each kind on four rows of different cached lengths (prefilled on the first call):
    a causal draft, a 2L verification, a fused verification with a pre-draft group, a prefill."""
    rows = getattr(pool, "_runner_rows", None)
    if rows is None:
        rows = pool._runner_rows = [pool.new_state() for _ in range(4)]
        gen = torch.Generator().manual_seed(0)
        for r, st in enumerate(rows):
            ids = torch.randint(3, 300, (8 + 9 * r,), generator=gen)
            adapter.prefill(st, ids, block_size=4, causal=True)
    M, (a, b, c, d) = adapter.info.mask_token_id, rows
    group = Predraft([9, M], [c.length + 4, c.length + 5], 2, True)
    info = adapter.info
    segments = [
        Segment.of(
            a, family.draft(info, a.length, [], [5, M, 7, M], start=a.length, block_size=4, causal=True)
        ),
        Segment.of(b, family.verify(info, b.length, [5, 6, 7, 8], start=b.length, slots=[1, 2, 3])),
        Segment.of(
            c, family.fused(info, c.length, [5, 6, 7, 8], start=c.length, slots=[1, 3], predrafts=[group])
        ),
        Segment.of(d, family.prefill(info, d.length, torch.tensor([11, 12, 13]), block_size=4, causal=False)),
    ]
    take_pages(segments)
    return segments


def test_one_batch_a_step_gives_each_row_what_run_gives(tiny, monkeypatch):
    adapter = tiny.adapter
    pool = adapter.fast.new_pool(page_size=16)
    runner = ModelRunner(adapter)
    batches: list[ForwardBatch] = []
    real = type(adapter).forward

    def forward(self, p, batch):
        assert p is pool and isinstance(batch.ids, np.ndarray)  # described on the host
        batches.append(batch)
        return real(self, p, batch)

    monkeypatch.setattr(type(adapter), "forward", forward)
    segments = mixed_segments(adapter, pool)
    empty = Segment(segments[0].state, [], [], torch.zeros(0, 0, dtype=torch.bool), keep=0,
                    logit_rows=torch.arange(0))  # fmt: skip
    got = runner.forward([*segments, empty])
    assert len(batches) == 1 and batches[0].rows >= len(segments)
    want = adapter.run(mixed_segments(adapter, pool))
    assert len(got) == len(segments) + 1 and got[-1].shape == (0, adapter.info.vocab_size)
    for g, w in zip(got, want, strict=False):
        assert torch.equal(g, w)


def test_a_segment_with_a_float_bias_takes_run(tiny, monkeypatch):
    adapter = tiny.adapter
    pool = adapter.fast.new_pool(page_size=16)
    st = pool.new_state()
    seg = Segment(st, [5, 6, 7, 8], list(range(4)), torch.ones(4, 4, dtype=torch.bool), keep=4,
                  logit_rows=torch.arange(4), bias=torch.zeros(4, 4))  # fmt: skip
    take_pages([seg])
    monkeypatch.setattr(type(adapter), "forward", lambda *a: pytest.fail("a biased segment was batched"))
    out = ModelRunner(adapter).forward([seg])
    assert out[0].shape == (4, adapter.info.vocab_size)

"""Logits in the model's dtype through the step's device half: a bf16 model's step never makes a float32
``[rows, vocab]`` tensor of more rows than one part (``logits_readers.row_chunks``), and the math done in
parts gives exactly what it gives in one part (tokens, probabilities, log-probabilities, traces)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from s2d2 import load
from s2d2.decoding import logits_readers
from s2d2.decoding.logits_readers import chunk_rows, in_chunks, row_chunks
from s2d2.engine.llm_engine import LLMEngine
from s2d2.tasks.tiny_gsm.splits import load_split

pytestmark = pytest.mark.usefixtures("step_by_step_planning")

#: drafting, plain and fused verification, sampling with the probabilistic rule, log-probabilities
#: (drafts' and verifications'), traces (AR probabilities of verified tokens), editing decoders
MIXES = (
    dict(preset="lossless", block_size=8),
    dict(preset="lossless-fused", block_size=8),
    dict(preset="lossless-fused", block_size=8, trace=True),
    dict(preset="lossless", block_size=8, temperature=1.0, acceptance="probabilistic", seed=5),
    dict(decoder="s2d2", policy="ucb", block_size=4, temperature=0.7, seed=1, logprobs=2, trace=True),
    dict(preset="lossless", block_size=8, logprobs=3),
    dict(decoder="dynamic", block_size=8),
    dict(decoder="ar", logprobs=0),
)


class Float32Rows(TorchDispatchMode):
    """The largest first dimension of a float32 output whose last dimension is ``vocab``."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.most = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float32
                and t.dim() == 2
                and t.shape[-1] == self.vocab
            ):
                self.most = max(self.most, t.shape[0])
        return out


def _generate(model, prompts, rows):
    cfgs = [model.make_config(max_new_tokens=16, **MIXES[i % len(MIXES)]) for i in range(len(prompts))]
    return LLMEngine(model.adapter, max_num_seqs=rows).generate(prompts, cfgs)


def _summary(outs):
    """Tokens, log-probabilities and traces (without the planner's timings)."""
    return [
        (o.token_ids, o.logprobs, [(t.commits, t.probs, t.span, t.accepted) for t in o.trace or []])
        for o in outs
    ]


def test_row_chunks_keep_queries_whole_and_cover_every_row(monkeypatch):
    monkeypatch.setattr(logits_readers, "FLOAT32_CHUNK_BYTES", 4 * 10 * 5)  # 5 rows of a 10-token vocabulary
    assert chunk_rows(10) == 5
    assert row_chunks([2, 2, 3, 7, 1], 10) == [(0, 2, 0, 4), (2, 3, 4, 7), (3, 4, 7, 14), (4, 5, 14, 15)]
    assert row_chunks([1, 1], 10) == [(0, 2, 0, 2)]
    x = torch.arange(12.0).view(12, 1)
    calls = []

    def fn(a, b):
        calls.append((a, b))
        return (x[a:b] * 2,)

    (got,) = in_chunks(fn, 12, 10)
    assert calls == [(0, 5), (5, 10), (10, 12)] and torch.equal(got, x * 2)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_math_in_parts_equals_the_math_in_one(dtype, monkeypatch):
    model = load("tiny-gsm", dtype=dtype, device="cpu")
    prompts = [model.encode(p["question"]) for p in load_split("test")[:16]]
    whole = _generate(model, prompts, 16)
    vocab = model.adapter.info.vocab_size
    monkeypatch.setattr(logits_readers, "FLOAT32_CHUNK_BYTES", 4 * vocab * 3)  # 3 rows a part
    parts = _generate(model, prompts, 16)
    assert all(o.status == "finished" for o in parts), [o.error for o in parts if o.error]
    assert _summary(parts) == _summary(whole)


def test_a_bf16_step_makes_no_float32_copy_of_all_its_rows(monkeypatch):
    model = load("tiny-gsm", dtype="bf16", device="cpu")
    prompts = [model.encode(p["question"]) for p in load_split("test")[:16]]
    vocab = model.adapter.info.vocab_size
    monkeypatch.setattr(logits_readers, "FLOAT32_CHUNK_BYTES", 4 * vocab * 8)  # 8 rows a part: one block
    with Float32Rows(vocab) as seen:
        outs = _generate(model, prompts, 16)
    assert all(o.status == "finished" for o in outs)
    # 16 rows drafting 8 slots each read 128 logit rows a step; float32 values of at most one part
    assert 0 < seen.most <= 8, seen.most
    # and without parts, the whole step's rows would be there at once (what the test would catch)
    monkeypatch.setattr(logits_readers, "FLOAT32_CHUNK_BYTES", 1 << 40)
    with Float32Rows(vocab) as seen:
        _generate(model, prompts, 16)
    assert seen.most > 8

"""A failing shared forward fails only the row(s) that caused it; the others get their undisturbed tokens."""

from __future__ import annotations

import pytest
import torch

import s2d2
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.runner.fault_isolation import isolate
from s2d2.tasks.tiny_gsm.splits import load_split

QUESTIONS = [p["question"] for p in load_split("test")[:6]]
#: the marked prompt's marker sits at this position (a prompt position of every test prompt)
MARK_AT = 12


class Poisoned:
    """An adapter whose forward fails (with an allocator-like error) while any segment carries the
    marked prompt's ``marker`` token at its position."""

    def __init__(self, adapter, marker: int):
        self.inner, self.marker = adapter, marker
        self.failures = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, segments):
        if any(marked(s, self.marker) for s in segments):
            self.failures += 1
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: not enough memory")
        return self.inner.run(segments)


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=8)


def _marker(model, outputs) -> int:
    """A token id that neither the test prompts nor their undisturbed ``outputs`` contain."""
    used = {t for q in QUESTIONS for t in model.encode(q)} | set(model.encode(" How many?"))
    used |= {t for o in outputs for t in o.token_ids}
    return next(t for t in range(16, model.info.vocab_size) if t not in used)


def _marked_prompt(model, marker: int) -> list[int]:
    return model.encode(QUESTIONS[0])[:MARK_AT] + [marker] + model.encode(" How many?")


def marked(seg, marker: int) -> bool:
    """Whether ``seg`` carries the marked prompt's marker (the marker token at its prompt position)."""
    ids, pos = torch.as_tensor(seg.ids), torch.as_tensor(seg.pos)  # segments hold lists or tensors
    return bool(((ids == marker) & (pos == MARK_AT)).any())


def _decode(adapter, prompts, configs):
    return LLMEngine(adapter, max_num_seqs=8).generate(prompts, configs)


@pytest.mark.parametrize("settings", [{}, {"preset": "lossless", "block_size": 8}, {"decoder": "dynamic"}])
def test_one_poisoned_row_fails_alone(model, settings):
    prompts = [model.encode(q) for q in QUESTIONS]
    cfg = model.make_config(max_new_tokens=48, **settings)
    alone = _decode(model.adapter, prompts, [cfg] * len(prompts))
    marker = _marker(model, alone)
    mixed = prompts[:3] + [_marked_prompt(model, marker)] + prompts[3:]
    poisoned = Poisoned(model.adapter, marker)
    outs = _decode(poisoned, mixed, [cfg] * len(mixed))
    assert poisoned.failures >= 2  # the whole batch, then the halves down to the one row
    assert outs[3].status == "failed" and "alloc_cpu" in outs[3].error
    rest = outs[:3] + outs[4:]
    assert [o.status for o in rest] == ["finished"] * len(prompts)
    assert [o.token_ids for o in rest] == [o.token_ids for o in alone]
    if cfg.plan != "auto":  # the planner prices each step's shape, and the poisoned row was in the first
        assert [o.stats.nfe for o in rest] == [o.stats.nfe for o in alone]


def test_a_failure_of_the_whole_batch_only_fails_nobody(model):
    """A failure no row causes alone (memory for all rows together) disappears in the halves."""
    prompts = [model.encode(q) for q in QUESTIONS[:4]]
    cfg = model.make_config(max_new_tokens=32)
    alone = _decode(model.adapter, prompts, [cfg] * 4)

    class Crowded(Poisoned):
        def run(self, segments):
            if len(segments) >= 4:
                self.failures += 1
                raise RuntimeError("out of memory")
            return self.inner.run(segments)

    crowded = Crowded(model.adapter, marker=-1)
    outs = _decode(crowded, prompts, [cfg] * 4)
    assert crowded.failures >= 1
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]


@pytest.mark.parametrize("native", [False, True])
def test_a_forward_that_fails_after_writing_caches_reruns_identically(native):
    """The failure comes after the batched path wrote every row's keys/values into the pool, or after
    the native path (one row at a time) appended earlier rows' caches: the re-runs must not see it."""
    m = s2d2.load("tiny-gsm", max_num_seqs=4)
    if native:
        m.adapter.fast = None  # transformers' own forward with a DynamicCache per row
    prompts = [m.encode(q) for q in QUESTIONS[:3]]
    cfg = m.make_config(max_new_tokens=24, preset="lossless", block_size=4)
    alone = _decode(m.adapter, prompts, [cfg] * 3)
    marker = _marker(m, alone)
    failures = []
    if native:
        real = m.adapter._native_forward

        def forward(seg):
            if marked(seg, marker):
                failures.append(seg)
                raise RuntimeError("late failure")
            return real(seg)

        m.adapter._native_forward = forward
    else:
        real = m.adapter.fast.forward_batch

        def forward(pool, batch):  # the engine's one batch a step (packed ids and positions)
            out = real(pool, batch)  # every row's keys and values are written now
            if marked(batch, marker):
                failures.append(batch)
                raise RuntimeError("late failure")
            return out

        m.adapter.fast.forward_batch = forward
    outs = _decode(m.adapter, prompts[:2] + [_marked_prompt(m, marker)], [cfg] * 3)
    assert len(failures) >= 2 and outs[2].status == "failed"
    assert [o.token_ids for o in outs[:2]] == [o.token_ids for o in alone[:2]]


def test_isolate_bisects_to_the_failing_rows():
    calls = []

    class Seg:
        def __init__(self, i):
            self.i = i

    def run(rows, segments):  # a forward advances nothing: there is nothing to roll back
        calls.append(list(rows))
        if 2 in rows or 5 in rows:
            raise RuntimeError("bad row")
        return [f"logits-{r}" for r in rows]

    rows = list(range(8))
    segs = [Seg(i) for i in rows]
    logits, failures = isolate(run, rows, segs)
    assert sorted(failures) == [2, 5]
    assert logits == [f"logits-{r}" if r not in (2, 5) else None for r in rows]
    assert calls[0] == rows and len(calls) <= 1 + 2 * 2 * 3

"""One writer per piece of row state (docs/ARCHITECTURE.md, "Who writes what").

A mixed batch (AR, plain and fused lossless, planned, a baseline, a sampled row) decodes under a KV budget
that preempts. Around every phase of every step a snapshot of every running row is compared: the planner,
the layouts and the forward change nothing; applying the plans changes only a row's pending verification,
action, step counters and trace; the pages are taken by the scheduler alone and the cached length grows
only in the step after the forward (and at admission, over prefix-cache pages).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

import s2d2
from conftest import load_or_skip
from s2d2.bench.suites import load_problems
from s2d2.engine import llm_engine
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.request import Request
from s2d2.forward.kv_pool import KVPool, KVState

CONFIGS = [
    dict(decoder="ar"),
    dict(preset="lossless", block_size=8),
    dict(preset="lossless-fused", block_size=8),
    dict(preset="lossless-auto", block_size=8),
    dict(decoder="dynamic", block_size=4, threshold=0.9),
    dict(decoder="ar", temperature=0.8, seed=1),
]


def snapshot(req: Request) -> dict[str, Any]:
    """Everything the engine keeps about a row, as comparable values."""
    st = req.state
    return {
        "status": req.status, "action": req.action, "tokens": list(req.tokens), "end": req.end,
        "cursor": repr(dataclasses.asdict(req.cursor)), "pending": repr(req.pending),
        "predraft": repr(req.predraft), "stats": dataclasses.asdict(req.stats),
        "cache": (req.cache.block_cached, req.cache.restore_to, req.cache.published),
        "length": None if st is None else st.length, "capacity": None if st is None else st.capacity,
        "trace": None if req.tracer.steps is None else repr(req.tracer.steps),
    }  # fmt: skip


def _running(engine: LLMEngine) -> dict[int, dict[str, Any]]:
    return {id(r): snapshot(r) for r in engine.scheduler.running}


def _changed(before: dict[int, dict], after: dict[int, dict]) -> set[str]:
    return {k for i in before.keys() & after.keys() for k in before[i] if before[i][k] != after[i][k]}


def _callers(depth: int = 3) -> list[str]:
    frame, out = sys._getframe(2), []
    for _ in range(depth):
        if frame is None:
            break
        out.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}")
        frame = frame.f_back
    return out


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


@pytest.mark.usefixtures("step_by_step_planning")  # the lossless-auto rows are planned every step
def test_each_phase_writes_only_its_own_fields(tiny, monkeypatch):
    engine = LLMEngine(tiny.adapter, max_num_seqs=6, kv_budget_tokens=192)
    seen: dict[str, set[str]] = {"plan": set(), "apply_plans": set(), "layout": set(), "forward": set()}
    calls = dict.fromkeys(seen, 0)

    def watched(name, fn):
        def run(*args):
            before = _running(engine)
            out = fn(*args)
            after = _running(engine)
            assert before.keys() == after.keys(), f"{name} moved rows between queues"  # the scheduler's
            seen[name] |= _changed(before, after)
            calls[name] += 1
            return out

        return run

    monkeypatch.setattr(engine.planner, "plan", watched("plan", engine.planner.plan))
    monkeypatch.setattr(llm_engine, "apply_plans", watched("apply_plans", llm_engine.apply_plans))
    monkeypatch.setattr(engine.runner, "layout", watched("layout", engine.runner.layout))
    monkeypatch.setattr(engine.runner, "run", watched("forward", engine.runner.run))
    writers = {"advance": [], "ensure": [], "release": []}
    advance, ensure, release = KVState.advance, KVPool.ensure, KVPool.release

    def spy_advance(self, n):
        writers["advance"].append(_callers())
        return advance(self, n)

    def spy_ensure(self, state, length):
        writers["ensure"].append(_callers())
        return ensure(self, state, length)

    def spy_release(self, state):
        writers["release"].append(_callers())
        return release(self, state)

    monkeypatch.setattr(KVState, "advance", spy_advance)
    monkeypatch.setattr(KVPool, "ensure", spy_ensure)
    monkeypatch.setattr(KVPool, "release", spy_release)
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 12)]
    configs = [tiny.make_config(**CONFIGS[i % 6], max_new_tokens=24, trace=True) for i in range(12)]
    outs = engine.generate(prompts, configs)
    assert all(o.status == "finished" for o in outs)
    assert engine.stats()["preemptions"] > 0 and calls["forward"] > 10 and calls["apply_plans"] > 10
    assert seen["plan"] == seen["layout"] == seen["forward"] == set()
    assert seen["apply_plans"] and seen["apply_plans"] <= {"action", "pending", "stats", "trace"}
    # the cached length grows in the step after the forward, or over prefix-cache pages at admission
    step = {"s2d2.engine.step.host.apply", "s2d2.engine.step.host.recomputed"}
    adopt = ["s2d2.forward.kv_pool.adopt", "s2d2.engine.scheduler._take_pages"]
    assert writers["advance"] and all(c[0] in step or c[:2] == adopt for c in writers["advance"])
    # pages are taken by the scheduler alone (at admission, and before each forward), and given back by it
    # alone (retirement, preemption, an admission that did not fit)
    assert writers["ensure"] and all(c[0].startswith("s2d2.engine.scheduler.") for c in writers["ensure"])
    released = {c[0] for c in writers["release"]}
    assert {"s2d2.engine.scheduler.retire", "s2d2.engine.scheduler.preempt"} <= released
    assert all(c.startswith("s2d2.engine.scheduler.") for c in released)


def test_a_shifted_familys_saved_prediction_is_kept_by_the_step_not_the_forward(monkeypatch):
    # Fast-dLLM v2 predicts the next position: each forward computes the prediction its row's next one
    # reads (KVState.extra); the forward returns it (Segment.saves) and the step keeps it
    model = load_or_skip("fast_dllm_v2")
    engine = LLMEngine(model.adapter, max_num_seqs=3)
    changed, kept = [], []
    run = engine.runner.run

    def forward(rows, segments):
        before = [dict(s.state.extra) for s in segments]
        out = run(rows, segments)
        changed.extend(b != s.state.extra for b, s in zip(before, segments, strict=True))
        kept.extend(s.saves is not None for s in segments)
        return out

    monkeypatch.setattr(engine.runner, "run", forward)
    prompts = [[3, 5, 7, 11, 13], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3]]
    cfg = model.make_config(preset="lossless", block_size=4, max_new_tokens=12, ignore_eos=True)
    outs = engine.generate(prompts, [cfg] * 3)
    ref = [model.generate(p, decoder="ar", max_new_tokens=12, ignore_eos=True).token_ids for p in prompts]
    assert [o.token_ids for o in outs] == ref  # lossless: the saved predictions were read where due
    assert kept and any(kept) and not any(changed)

"""The AR lane (s2d2.engine.step.lanes, host.apply_ar_draft) writes every row as the general step does.

Two engines decode the same mixed batch in lockstep under a KV budget that preempts, one with the lane,
one with every row on the general step (``engine.lanes = False``); after every step every row (its
tokens, cursor, cache, statistics, action and status) and every output are the same in both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import s2d2
from conftest import load_or_skip
from s2d2.bench.suites import load_problems
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.request import Request
from s2d2.engine.runner import model_runner
from s2d2.engine.step import lanes, postprocess
from s2d2.forward.kv_pool import KVState

TIMES = {"seconds", "first_token_seconds"}


def snapshot(req: Request) -> dict[str, Any]:
    st = req.state
    stats = {k: v for k, v in dataclasses.asdict(req.stats).items() if k not in TIMES}
    return {
        "status": req.status, "action": req.action, "tokens": list(req.tokens), "end": req.end,
        "cursor": repr(dataclasses.asdict(req.cursor)), "pending": repr(req.pending), "stats": stats,
        "cache": (req.cache.block_cached, req.cache.restore_to, req.cache.published),
        "length": None if st is None else st.length, "output": req.output_ids,
    }  # fmt: skip


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


def _engine(tiny, lanes: bool) -> LLMEngine:
    engine = LLMEngine(tiny.adapter, max_num_seqs=6, kv_budget_tokens=192)
    engine.lanes = lanes
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 10)]
    stop = tiny.encode(" the")[-1:]  # a common token: some AR rows stop on it
    configs = [
        dict(decoder="ar", max_new_tokens=24),
        dict(decoder="ar", max_new_tokens=24, stop_token_ids=stop),
        dict(decoder="ar", max_new_tokens=3),
        dict(preset="lossless", block_size=8, max_new_tokens=24),
        dict(decoder="ar", temperature=0.8, seed=1, max_new_tokens=24),  # sampled: the general step
        dict(decoder="dynamic", block_size=4, threshold=0.9, max_new_tokens=24),
        dict(decoder="ar", max_new_tokens=24, trace=True),  # traced: the general step
    ]
    for i, p in enumerate(prompts):
        engine.add_request(p, tiny.make_config(**configs[i % len(configs)]), request_id=i)
    return engine


def test_the_lane_writes_rows_as_the_general_step_does(tiny, monkeypatch):
    lane_rows = []
    apply_ar_draft = lanes.apply_ar_draft

    def counted(req, *args):
        lane_rows.append(req.request_id)
        return apply_ar_draft(req, *args)

    monkeypatch.setattr(lanes, "apply_ar_draft", counted)
    fast, general = _engine(tiny, True), _engine(tiny, False)
    done = in_lockstep(fast, general)
    assert done["fast"] == done["general"] and len(done["fast"]) == 10
    assert {"finished"} == {status for _, status, _ in done["fast"].values()}
    assert "stop" in {done["fast"][i][2] for i in (1, 8)}  # a lane row met its stop token
    assert fast.stats()["preemptions"] > 0 and fast.stats()["preemptions"] == general.stats()["preemptions"]
    # the lane ran (greedy AR rows, stopped ones included) and only for lane rows
    assert set(lane_rows) == {0, 1, 2, 7, 8, 9}


def test_the_lane_is_the_step_that_advances_cached_lengths(tiny, monkeypatch):
    callers = set()
    advance = KVState.advance

    def spy(self, n):
        import sys

        callers.add(sys._getframe(1).f_code.co_name)
        return advance(self, n)

    monkeypatch.setattr(KVState, "advance", spy)
    engine = _engine(tiny, True)
    while engine.has_unfinished():
        engine.step()
    fast = {"apply_ar_draft", "apply_plain_draft", "apply_plain_verify"}  # the AR and lossless lanes
    assert {"apply_ar_draft", "apply_plain_verify"} <= callers
    assert callers <= fast | {"apply", "recomputed", "adopt"}


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2", "llada2"])
def test_the_lane_equals_the_general_step_on_every_family(family, monkeypatch):
    """Each family's AR rows (the shifted one's slot-0 draft included), lane on and off, with prompts
    whose lengths fold into the first draft or need a prefill, under a budget that preempts."""
    model = load_or_skip(family)
    laned = []
    apply_ar_draft = lanes.apply_ar_draft

    def counted(req, *args):
        laned.append(req.request_id)
        return apply_ar_draft(req, *args)

    monkeypatch.setattr(lanes, "apply_ar_draft", counted)
    prompts = random_prompts(model, seed=3)
    cfgs = [model.make_config(decoder="ar", max_new_tokens=12, ignore_eos=i % 2 == 0) for i in range(6)]
    outs = lanes_on_and_off(model, prompts, cfgs, kv_budget_tokens=128)
    assert outs[True] == outs[False]
    assert all(status == "finished" for _, status, _ in outs[True])
    assert len(laned) > 30  # the lane ran (row steps)


def test_when_the_batched_queries_fail_the_lane_rows_run_alone(tiny, monkeypatch):
    """A device half that fails for the whole batch (and for no row alone): every row, the lane's
    included, runs its queries alone and decodes as undisturbed."""
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 4)]
    cfg = tiny.make_config(decoder="ar", max_new_tokens=16)
    undisturbed = LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * 4)
    run_queries, failures = postprocess.run_queries, []

    def crowded(dev, edits, drafts, verifies, batched=(), **reader):
        if batched or len({id(q.req) for q in drafts}) + sum(len(q.slots) > 1 for q in drafts) > 1:
            failures.append(1)
            raise RuntimeError("out of memory")
        return run_queries(dev, edits, drafts, verifies, batched, **reader)

    monkeypatch.setattr(postprocess, "run_queries", crowded)
    outs = LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * 4)
    assert failures and [o.token_ids for o in outs] == [o.token_ids for o in undisturbed]
    assert [o.stats.nfe for o in outs] == [o.stats.nfe for o in undisturbed]


def random_prompts(model, seed: int, count: int = 6) -> list[list[int]]:
    """``count`` random prompts of 3-39 tokens without the mask token: some fold into the first draft,
    some need a prefill."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    while len(prompts) < count:
        n = int(torch.randint(3, 40, (1,), generator=gen))
        p = torch.randint(0, model.info.vocab_size, (n,), generator=gen)
        if not bool((p == model.info.mask_token_id).any()):
            prompts.append(p.tolist())
    return prompts


def lanes_on_and_off(model, prompts, cfgs, kv_budget_tokens: int) -> dict[bool, list]:
    """Each request's tokens, status and statistics (timings left out), decoded with the lanes on and
    off, 4 rows at a time under ``kv_budget_tokens`` (a budget that preempts)."""
    outs = {}
    for on in (True, False):
        engine = LLMEngine(model.adapter, max_num_seqs=4, kv_budget_tokens=kv_budget_tokens, prefill_chunk=16)
        engine.lanes = on
        got = engine.generate(prompts, cfgs)
        outs[on] = [
            (o.token_ids, o.status, {k: v for k, v in dataclasses.asdict(o.stats).items() if k not in TIMES})
            for o in got
        ]
    return outs


def in_lockstep(fast: LLMEngine, general: LLMEngine) -> dict[str, dict]:
    """Step both engines (lanes on, lanes off) together to the end, asserting after every step that each
    running row's snapshot is the same in both; each finished request's tokens, status and finish
    reason, per engine."""
    done: dict[str, dict] = {"fast": {}, "general": {}}
    steps = 0
    while fast.has_unfinished() or general.has_unfinished():
        for name, engine in (("fast", fast), ("general", general)):
            for out in engine.step():
                if out.finished:
                    o = out.output
                    done[name][out.request_id] = (o.token_ids, o.status, o.stats.finish_reason)
        rows = {r.request_id: snapshot(r) for r in fast.scheduler.running}
        assert rows == {r.request_id: snapshot(r) for r in general.scheduler.running}, f"step {steps}"
        steps += 1
    return done


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_a_steady_rows_layout_is_the_familys_draft(family, monkeypatch):
    """The AR lane's steady draft, written out by the runner, equals what the family's layouts lay out for
    the row (ids, positions, visibility, kept keys, logit rows), at every steady step of a batch."""
    model = load_or_skip(family)
    engine = LLMEngine(model.adapter, max_num_seqs=4)
    runner, seen = engine.runner, []
    layout = runner.layout

    def checked(req):
        got = layout(req)
        if got.steady:  # the same row laid out by the family's layouts
            model_runner.steady = lambda r: False
            try:
                want = layout(req)
            finally:
                model_runner.steady = lanes.steady
            a, b = got.segment, want.segment
            assert (list(a.ids), list(a.pos), a.keep, a.zero_rows, got.extension, got.lead) == (
                list(b.ids), list(b.pos), b.keep, b.zero_rows, want.extension, want.lead
            )
            assert a.spec == b.spec and a.logit_rows.tolist() == b.logit_rows.tolist()
            seen.append(req.request_id)
        return got

    monkeypatch.setattr(runner, "layout", checked)
    cfgs = [model.make_config(decoder="ar", max_new_tokens=10, ignore_eos=True) for _ in range(4)]
    outs = engine.generate(random_prompts(model, seed=5, count=4), cfgs)
    assert all(o.status == "finished" for o in outs) and len(seen) > 20

"""The lossless lane (s2d2.engine.step.lanes; host.apply_plain_draft, apply_plain_verify) writes every
row exactly as the general step does.

As for the AR lane (test_ar_lane.py): two engines decode the same mixed batch in lockstep under a KV budget
that preempts, one with the lanes, one with every row on the general step (``engine.lanes = False``);
after every step every row and every output are the same in both.
"""

from __future__ import annotations

import pytest
from test_ar_lane import in_lockstep, lanes_on_and_off, random_prompts

import s2d2
from conftest import load_or_skip
from s2d2.bench.suites import load_problems
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.step import host, lanes, postprocess


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False)


CONFIGS = [
    dict(preset="lossless", block_size=8, max_new_tokens=24),
    dict(preset="lossless", block_size=16, max_new_tokens=24, stop_token_ids="the"),
    dict(decoder="s2d2", policy="always", block_size=8, steps=4, max_new_tokens=24),  # quota 2: top-ups
    dict(decoder="s2d2", policy="always", block_size=8, sub_block_size=4, max_new_tokens=5),
    dict(preset="lossless", block_size=8, fuse=True, max_new_tokens=24),  # fused: the general step
    dict(preset="lossless", block_size=8, max_new_tokens=24, trace=True),  # traced: the general step
    dict(
        decoder="s2d2", policy="always", block_size=8, temperature=0.8, seed=1, max_new_tokens=24
    ),  # sampled
    dict(decoder="ar", max_new_tokens=24),  # the AR lane beside it
]


def _engine(tiny, lanes: bool) -> LLMEngine:
    engine = LLMEngine(tiny.adapter, max_num_seqs=6, kv_budget_tokens=256)
    engine.lanes = lanes
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 12)]
    stop = tiny.encode(" the")[-1:]  # a common token: some rows stop on it
    for i, p in enumerate(prompts):
        cfg = dict(CONFIGS[i % len(CONFIGS)])
        if cfg.get("stop_token_ids") == "the":
            cfg["stop_token_ids"] = stop
        engine.add_request(p, tiny.make_config(**cfg), request_id=i)
    return engine


def _count_lane_rows(monkeypatch) -> list:
    """Patch the lane's row bookkeeping to record each row it handles: (request id, draft or verify)."""
    seen = []
    for name in ("apply_plain_draft", "apply_plain_verify"):
        fn = getattr(lanes, name)

        def counted(req, *args, _fn=fn, _name=name):
            seen.append((req.request_id, _name))
            return _fn(req, *args)

        monkeypatch.setattr(lanes, name, counted)
    return seen


def _count_branches(monkeypatch) -> dict[str, int]:
    """Patch the lane's written-out steps and the general step's functions it falls back to, counting
    each call made inside a lane row's step; ``walk_known``: block-loop walks the lane ended without the
    general walk."""
    calls: dict[str, int] = {}
    inside = [False]
    for name in ("apply_plain_draft", "apply_plain_verify"):
        fn = getattr(lanes, name)

        def lane_step(*args, _fn=fn):
            inside[0] = True
            try:
                return _fn(*args)
            finally:
                inside[0] = False

        monkeypatch.setattr(lanes, name, lane_step)
    general = ("draft_step", "accept_span", "finish_step", "close_block", "advance")
    for name in ("_route_all", "accept_plain", *general):
        fn = getattr(host, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            if inside[0]:
                calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(host, name, counted)
    walk = host.walk_verified

    def walk_counted(*args):
        before = calls.get("advance", 0)
        walk(*args)
        if calls.get("advance", 0) == before:
            calls["walk_known"] = calls.get("walk_known", 0) + 1

    monkeypatch.setattr(host, "walk_verified", walk_counted)
    return calls


def test_the_lossless_lane_writes_rows_as_the_general_step_does(tiny, monkeypatch):
    seen = _count_lane_rows(monkeypatch)
    branches = _count_branches(monkeypatch)
    fast, general = _engine(tiny, True), _engine(tiny, False)
    done = in_lockstep(fast, general)
    # the written-out steps ran, and so did the general functions the lane falls back to (the quota-2
    # row's top-ups, blocks the lane closes itself, walks it leaves to the block loop)
    written_out = {"_route_all", "accept_plain"}
    assert written_out | {"accept_span", "finish_step", "close_block", "advance"} <= set(branches)
    assert branches["walk_known"] > 0
    assert done["fast"] == done["general"] and len(done["fast"]) == 12
    assert {"finished"} == {status for _, status, _ in done["fast"].values()}
    assert fast.stats()["preemptions"] > 0 and fast.stats()["preemptions"] == general.stats()["preemptions"]
    assert "stop" in {done["fast"][i][2] for i in (1, 9)}  # a lane row met its stop token
    # the lane ran, drafting and verifying, and only for its rows (greedy strict always, not fused/traced)
    assert {kind for _, kind in seen} == {"apply_plain_draft", "apply_plain_verify"}
    assert {rid for rid, _ in seen} == {0, 1, 2, 3, 8, 9, 10, 11}
    # the general step saw the quota-2 row top up by rule after a verification: the lane does it too
    assert done["fast"][2][1] == "finished"


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2", "llada2"])
def test_the_lossless_lane_equals_the_general_step_on_every_family(family, monkeypatch):
    """Each family's lossless rows (the shifted one's slot-0 commit included), lanes on and off, with
    prompts whose lengths fold into the first draft or need a prefill, under a budget that preempts."""
    model = load_or_skip(family)
    seen = _count_lane_rows(monkeypatch)
    prompts = random_prompts(model, seed=5)
    bs = model.info.default_block_size
    cfgs = [
        model.make_config(
            decoder="s2d2",
            policy="always",
            block_size=bs,
            max_new_tokens=12,
            ignore_eos=i % 2 == 0,
            plan="fixed",
        )
        for i in range(6)
    ]
    outs = lanes_on_and_off(model, prompts, cfgs, kv_budget_tokens=160)
    assert outs[True] == outs[False]
    assert all(status == "finished" for _, status, _ in outs[True])
    assert len(seen) > 20  # the lane ran


def test_when_the_batched_queries_fail_the_lossless_rows_run_alone(tiny, monkeypatch):
    """A device half that fails for the whole batch (and for no row alone): the lane's rows run their
    queries alone and decode as undisturbed."""
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 4)]
    cfg = tiny.make_config(preset="lossless", block_size=8, max_new_tokens=16)
    undisturbed = LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * 4)
    run_queries, failures = postprocess.run_queries, []

    def crowded(dev, edits, drafts, verifies, batched=(), **reader):
        if batched:
            failures.append(1)
            raise RuntimeError("out of memory")
        return run_queries(dev, edits, drafts, verifies, **reader)

    monkeypatch.setattr(postprocess, "run_queries", crowded)
    outs = LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * 4)
    assert failures and [o.token_ids for o in outs] == [o.token_ids for o in undisturbed]
    assert [o.stats.nfe for o in outs] == [o.stats.nfe for o in undisturbed]

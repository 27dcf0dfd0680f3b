"""``s2d2 bench-batch --request-rate R``: open-loop Poisson arrivals and time to first token from arrival."""

from __future__ import annotations

import time

import pytest

from conftest import assert_one_line_error, load_or_skip, run_cli
from s2d2.bench import throughput, throughput_table
from s2d2.bench.suites import load_problems
from s2d2.engine.llm_engine import LLMEngine
from s2d2.errors import S2D2Error


@pytest.fixture(scope="module")
def tiny():
    return load_or_skip("tiny-gsm")


def test_arrival_times_are_seeded_increasing_poisson():
    a = throughput.arrival_times(200, 20.0)
    assert a == throughput.arrival_times(200, 20.0)  # the same in every cell
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))
    assert 0.7 / 20 < a[-1] / 199 < 1.3 / 20  # mean gap about 1 / rate
    assert throughput.arrival_times(200, 40.0) != a
    assert throughput.arrival_times(3, None) == [0.0, 0.0, 0.0]
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(S2D2Error, match="--request-rate"):
            throughput.arrival_times(3, bad)


def test_streamed_waits_for_arrivals_and_times_ttft_from_them(tiny):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 4)]
    cfg = tiny.make_config(decoder="ar", max_new_tokens=8)
    arrivals = [0.0, 0.05, 0.1, 0.4]  # the last one arrives after the others are done: the loop sleeps
    engine = LLMEngine(tiny.adapter, max_num_seqs=2, stream=True)
    t0 = time.perf_counter()
    outs, ttfts = throughput._streamed(engine, prompts, cfg, t0, arrivals)
    assert time.perf_counter() - t0 >= arrivals[-1]
    assert [o.request_id for o in outs] == [0, 1, 2, 3] and all(o.token_ids for o in outs)
    for o, t in zip(outs, ttfts, strict=True):
        assert t is not None and t >= o.stats.first_token_seconds > 0  # arrival <= admission
    # without arrivals every request arrives at t0: the same tokens
    again, _ = throughput._streamed(LLMEngine(tiny.adapter, max_num_seqs=2, stream=True), prompts, cfg, 0.0)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_requests_arriving_together_are_shaped_for_their_joint_load(tiny, monkeypatch):
    # a plan=auto request's decoding is chosen for the rows it will share steps with: every request of
    # a burst knows the others (as generate does), a later arrival the rows then running and waiting
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 5)]
    cfg = tiny.make_config(decoder="ar", max_new_tokens=4)
    engine = LLMEngine(tiny.adapter, max_num_seqs=8, stream=True)
    seen = []
    add = engine.add_request

    def spy(prompt, config, rid, **kw):
        seen.append((rid, kw.get("expected_rows"), engine.num_running + engine.num_waiting))
        return add(prompt, config, rid, **kw)

    monkeypatch.setattr(engine, "add_request", spy)
    throughput._streamed(engine, prompts, cfg, time.perf_counter(), [0.0, 0.0, 0.0, 0.0, 0.3])
    burst, late = seen[:4], seen[4]
    assert [rows for _, rows, _ in burst] == [4, 4, 4, 4]
    assert late[0] == 4 and late[1] == late[2] + 1  # the rows still there, and itself


def test_run_throughput_with_a_rate_streams_the_same_arrivals_in_every_cell(tiny, monkeypatch):
    seen = []
    streamed = throughput._streamed

    def spy(engine, prompts, cfg, t0, arrivals=None):
        seen.append(list(arrivals))
        return streamed(engine, prompts, cfg, t0, arrivals)

    monkeypatch.setattr(throughput, "_streamed", spy)
    caches = (False, True)
    out = throughput.run_throughput(
        tiny, n=4, limits=(1, 2), configs=("ar",), max_new_tokens=8, prefix_cache=caches, request_rate=50.0
    )
    assert len(seen) == 4  # 2 limits x 2 prefix-cache settings (the warm-up does not stream)
    assert all(a == seen[0] for a in seen) and seen[0] == throughput.arrival_times(4, 50.0)
    assert out["request_rate"] == 50.0 and len(out["rows"]) == 4
    for r in out["rows"]:  # TTFT without --shared-prefix
        assert r["request_rate"] == 50.0
        assert r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0 and r["ttft_admitted_p50_ms"] > 0
    text = throughput_table.render(out)
    assert "TTFT p99 ms" in text and "Poisson process at 50/s" in text

    seen.clear()
    closed = throughput.run_throughput(tiny, n=2, limits=(2,), configs=("ar",), max_new_tokens=8)
    assert not seen and closed["request_rate"] is None and closed["rows"][0]["request_rate"] is None
    assert "ttft_p50_ms" not in closed["rows"][0] and "TTFT" not in throughput_table.render(closed)


def test_bench_batch_rejects_a_bad_rate(capsys):
    for bad in ("0", "-2.5"):
        code, _, err = run_cli(capsys, "bench-batch", "--n", "2", "--request-rate", bad, "--no-progress")
        assert_one_line_error(code, err, "--request-rate must be > 0")


def test_a_table_that_starts_with_a_planned_configuration_renders(tiny):
    """A planned row carries the planner's predicted ms without a cost profile; with it first, the table
    used to ask every row for projected tokens/s and fail (KeyError)."""
    out = throughput.run_throughput(tiny, n=2, limits=(2,), configs=("lossless-auto", "ar"), max_new_tokens=8)
    text = throughput_table.render(out)
    assert "| lossless-auto | 2 |" in text and "| ar | 2 |" in text
    assert "PROJECTED" not in text and "tokens/s, predicted" not in text

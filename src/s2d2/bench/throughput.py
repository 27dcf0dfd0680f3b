"""Throughput of the batched engine: output tokens/s by batch limit, side by side in one run.

For each batch limit (``max_num_seqs``) and configuration, the same problems are decoded on a fresh
engine over the same model; limits and configurations are interleaved (each repeat visits the limits in
turn and, within a limit, the configurations from a rotating start at a stride that changes each
repeat: :func:`cell_order`, no configuration always follows the same one) so drift and what a cell
leaves behind hit all alike, and figures are medians over repeats. Every configuration is warmed up
untimed before the first timed cell, and every cell starts from a collected heap (:func:`settle`:
Python's garbage collected and the C allocator's free memory returned), so what ran before a cell (a
fused cell's larger tensors) does not change what it measures. Reported per cell: output tokens/s
(generated tokens only, prompts excluded), speed-up against one row, forwards/s, mean rows per
forward, query tokens per forward and per second, and per configuration the query tokens fed per
committed token; and each configuration that chooses by load (``plan="auto"``) over the best of the
others at each limit (``auto_vs_best_fixed``, the best named). The query-token ceiling is measured
once: the rate of one large packed forward (``ceiling_rows`` x ``ceiling_tokens`` query tokens).

Arrivals: by default every request is queued at the start (a closed batch: tokens/s is the engine's
drain rate). With a request rate the run is open-loop: requests arrive as a Poisson process (seeded, the
same arrival times in every cell), each is added to the engine once its arrival time has passed, and time
to first token is measured from arrival; tokens/s is then bound by the arrivals, not only the engine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..cost.step_cost import StepCost
from ..engine.llm_engine import LLMEngine
from ..errors import S2D2Error
from .grids import BenchConfig, get_grid
from .shared_prefix import shared_prefix_ids
from .suites import load_problems
from .throughput_table import auto_vs_best_fixed, is_auto, summarize

#: The configurations of the throughput table (names of the default bench grid).
DEFAULT_CONFIGS = (
    "ar",
    "dynamic-b8-t0.9",
    "s2d2-b8-always-strict",
    "s2d2-b16-always-strict",
    "s2d2-b8-score-dynamic-strict",
    "s2d2-b16-score-dynamic-strict",
    "lossless-b8",
    "lossless-b16",
)
DEFAULT_LIMITS = (1, 4, 16, 64)


def pick_configs(names: Sequence[str]) -> list[BenchConfig]:
    """Configurations of the default bench grid by name (a one-line error for an unknown name)."""
    grid = {c.name: c for c in get_grid("default")}
    missing = [n for n in names if n not in grid]
    if missing:
        raise S2D2Error(f"unknown configuration {missing[0]!r}; names come from `s2d2 bench --grid default`")
    return [grid[n] for n in names]


def _one_cell(
    model: Any,
    prompts: list[list[int]],
    cfg: Any,
    limit: int,
    cost: StepCost | None = None,
    memory: dict[str, Any] | None = None,
    ttft: bool = False,
    request_rate: float | None = None,
) -> dict[str, float]:
    """Decode every prompt on a fresh engine with ``limit`` rows; the raw counts of that run (with
    ``cost``: each step's predicted time too; ``memory``: the engine's KV settings; with ``ttft`` the
    engine streams and each request's time to its first final token is measured). With
    ``request_rate`` (requests/s) the requests arrive at :func:`arrival_times` instead of all at the
    start, and time to first token is measured (from each request's arrival) whatever ``ttft`` says."""
    streamed = ttft or request_rate is not None
    engine = LLMEngine(model.adapter, max_num_seqs=limit, cost=cost, stream=streamed, **(memory or {}))
    arrivals = arrival_times(len(prompts), request_rate)
    t0 = time.perf_counter()
    if streamed:
        outs, ttfts = _streamed(engine, prompts, cfg, t0, arrivals)
        first = [t for t in ttfts if t is not None]
    else:
        outs, first = engine.generate(prompts, [cfg] * len(prompts)), []
    seconds = time.perf_counter() - t0
    c = engine.stats()
    return {
        **_memory_counts(outs, c, first),
        "seconds": seconds,
        "tokens": sum(o.stats.generated_tokens for o in outs),
        "forwards": c["forwards"],
        "rows": c["rows"],
        "query_tokens": c["query_tokens"],
        "host_syncs_per_step": c["host_syncs_per_step"],
        "forward_ms_per_step": c["forward_ms_per_step"],
        "other_ms_per_step": c["other_ms_per_step"],
        "predicted_ms_per_step": c["predicted_ms_per_step"],
        "predicted_abs_error": c["predicted_abs_error"],
        "steps": c["steps"],
        "plan_predicted_ms_per_step": c["plan_predicted_ms_per_step"],
        "plan_ms_per_step": c["plan_ms_per_step"],
        "plan_rows": c["plan_rows"],
        "plan_mean_block_size": c["plan_mean_block_size"],
        "plan_fixed_choices": c["plan_fixed_choices"],
        "plan_ar_choices": c["plan_ar_choices"],
        "plan_admissions": c["plan_admissions"],
    }


def settle() -> None:
    """Start a timed cell from the same heap state whatever ran before: Python's garbage collected and,
    with glibc, the allocator's free memory handed back (``malloc_trim``), so a cell does not inherit a
    fragmented heap or a pending collection from the cell before it."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


_LIBC = _libc()


def cell_order(repeat: int, limit_index: int, k: int) -> list[int]:
    """The order the ``k`` configurations run in at one (repeat, limit): from a start that rotates with
    both, every ``step``-th configuration, the step another number coprime to ``k`` each repeat, so what
    runs just before a configuration changes from repeat to repeat (a plain rotation keeps the same
    neighbours: the one after the fused cells always ran after them), for as many repeats as ``k`` has
    such steps; a rerun of the command runs the same order."""
    steps = [s for s in range(1, k) if math.gcd(s, k) == 1] or [1]
    step, start = steps[repeat % len(steps)], (repeat + limit_index) % max(k, 1)
    return [(start + i * step) % k for i in range(k)]


def query_ceiling(model: Any, rows: int = 64, tokens: int = 32, repeats: int = 5) -> float:
    """Query tokens per second of one packed forward of ``rows`` x ``tokens`` (median of ``repeats``)."""
    from ..forward.segment import Segment

    ad = model.adapter
    pool = ad.new_pool()
    states = [pool.new_state() for _ in range(rows)]
    ids = torch.randint(5, model.info.vocab_size - 1, (tokens,))
    ids[ids == model.info.mask_token_id] = 5
    mask = torch.ones(tokens, tokens, dtype=torch.bool)
    times = []
    for _ in range(repeats + 1):
        segs = [
            Segment(s, ids, torch.arange(tokens), mask, keep=0, logit_rows=Segment.last_rows(tokens, tokens))
            for s in states
        ]
        t0 = time.perf_counter()
        ad.run_and_keep(segs)
        times.append(time.perf_counter() - t0)
    return rows * tokens / statistics.median(times[1:])


def arrival_times(n: int, request_rate: float | None, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of ``n`` requests arrives: all at 0 without a rate, else a
    Poisson process of ``request_rate`` requests/s: the first at 0, then cumulative exponential gaps
    drawn from ``random.Random(seed)`` (the same times on every call, so cells compare side by side)."""
    check_request_rate(request_rate)
    if request_rate is None:
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(request_rate) if i else 0.0
        out.append(t)
    return out


def check_request_rate(request_rate: float | None) -> None:
    """A one-line error unless ``request_rate`` is None or a positive finite number of requests/s."""
    if request_rate is not None and not (0 < request_rate < math.inf):
        raise S2D2Error(f"--request-rate must be > 0 requests/s, got {request_rate}")


def _streamed(
    engine: LLMEngine, prompts: list[list[int]], cfg: Any, t0: float, arrivals: Sequence[float] | None = None
) -> tuple[list, list[float | None]]:
    """Decode on a streaming engine, request ``i`` added once ``arrivals[i]`` seconds have passed since
    ``t0`` (all at once without ``arrivals``; requests that arrive together are shaped for the load they
    make together, as :meth:`~s2d2.engine.llm_engine.LLMEngine.generate` does); the outputs and, in
    request order, each request's seconds from its arrival to its first final token (None for one that
    produced no token). While the engine has nothing to do and arrivals remain, it sleeps until the next
    one."""
    arrivals = list(arrivals) if arrivals is not None else [0.0] * len(prompts)
    outs: dict[int, Any] = {}
    first: dict[int, float] = {}
    added = 0
    while added < len(prompts) or engine.has_unfinished():
        now = time.perf_counter() - t0
        due = added
        while due < len(prompts) and now >= arrivals[due]:
            due += 1
        rows = engine.num_running + engine.num_waiting + (due - added)  # those arriving together know it
        for i in range(added, due):
            engine.add_request(prompts[i], cfg, i, expected_rows=rows)
        added = due
        if not engine.has_unfinished():
            time.sleep(max(0.0, arrivals[added] - (time.perf_counter() - t0)))
            continue
        for o in engine.step():
            if o.new_token_ids and o.request_id not in first:
                first[o.request_id] = time.perf_counter() - t0 - arrivals[o.request_id]
            if o.finished:
                outs[o.request_id] = o.output
    return [outs[i] for i in range(len(prompts))], [first.get(i) for i in range(len(prompts))]


def _memory_counts(outs: list, stats: dict[str, Any], first: list[float]) -> dict[str, float]:
    """Prefill forwards per request, prefix reuse, preemptions and, when ``first`` holds each request's
    seconds from its arrival to its first token (at the start, or its Poisson arrival with a request
    rate), time to first token: p50 and p99 from arrival, p50 from admission (ms)."""
    out = {
        "prefill_forwards_per_request": statistics.mean(o.stats.nfe_prefill for o in outs),
        "prefix_hit_rate": stats.get("prefix_hit_rate", 0.0),
        "preemptions": stats.get("preemptions", 0),
    }
    if first:
        out["ttft_p50_ms"] = 1e3 * statistics.median(first)
        out["ttft_p99_ms"] = 1e3 * float(np.percentile(first, 99))  # linear between the nearest ranks
        out["ttft_admitted_p50_ms"] = 1e3 * statistics.median(o.stats.first_token_seconds for o in outs)
    return out


def run_throughput(
    model: Any,
    *,
    n: int = 128,
    limits: Sequence[int] = DEFAULT_LIMITS,
    configs: Sequence[str] = DEFAULT_CONFIGS,
    max_new_tokens: int = 64,
    repeats: int = 1,
    split: str = "test",
    progress: bool = False,
    cost: StepCost | None = None,
    simulate: str | None = None,
    prefix_cache: Sequence[bool] = (True,),
    kv_page_size: int = 16,
    kv_budget_tokens: int | None = None,
    shared_prefix: int = 0,
    request_rate: float | None = None,
) -> dict[str, Any]:
    """Measure every (limit, configuration) cell on the same ``n`` tiny-gsm problems; see the module.

    With ``cost`` every step's predicted time is recorded beside the measured one. ``simulate`` names
    that profile when it is a projection of another model on other hardware (``roofline:h200`` of a
    shape): tokens/s are then also given on the simulated clock, as ``projected_tokens_per_s``.
    KV memory: every cell runs once per ``prefix_cache`` setting (interleaved), on pages of
    ``kv_page_size`` positions within ``kv_budget_tokens``; ``shared_prefix`` puts the same N-token
    prefix of worked dev examples before every problem (:mod:`s2d2.bench.shared_prefix`) and measures
    each request's time to first token. ``request_rate`` (requests/s): open-loop Poisson arrivals
    (:func:`arrival_times`, the same in every cell) instead of every request at the start; time to first
    token is then measured from arrival, with or without a shared prefix, and tokens/s is bound by the
    arrivals."""
    if any(limit < 1 for limit in limits):
        raise S2D2Error("batch limits must be >= 1")
    if repeats < 1 or n < 1:
        raise S2D2Error("--n and --repeats must be >= 1")
    check_request_rate(request_rate)
    cfgs = pick_configs(configs)
    # rows are spelled against the library's defaults, not the model's own preset (as in s2d2 bench)
    base = model.checkpoint_config()
    decode_cfgs = [
        model.make_config(base, **c.expanded(), max_new_tokens=max_new_tokens, seed=0) for c in cfgs
    ]
    prefix = shared_prefix_ids(model.encode, shared_prefix)
    prompts = [prefix + model.encode(p["question"]) for p in load_problems("tiny-gsm", split, n)]
    for cfg in decode_cfgs:  # warm-up, untimed: every configuration's code paths before any timed cell
        _one_cell(model, prompts[:4], cfg, 4, cost)
    memories = [
        dict(prefix_cache=on, kv_page_size=kv_page_size, kv_budget_tokens=kv_budget_tokens)
        for on in prefix_cache
    ]
    cells: dict[tuple[int, int, int], list[dict[str, float]]] = {}
    from tqdm.auto import tqdm

    total = repeats * len(limits) * len(cfgs) * len(memories)
    with tqdm(total=total, desc="bench-batch", file=sys.stderr, disable=not progress) as bar:
        for r in range(repeats):
            for li, limit in enumerate(limits):
                k = len(cfgs)
                for j in cell_order(r, li, k):
                    for mi in [(r + s) % len(memories) for s in range(len(memories))]:
                        settle()
                        cell = _one_cell(
                            model,
                            prompts,
                            decode_cfgs[j],
                            limit,
                            cost,
                            memories[mi],
                            ttft=shared_prefix > 0,
                            request_rate=request_rate,
                        )
                        cells.setdefault((li, j, mi), []).append(cell)
                        bar.update(1)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = summarize(
        cfgs, limits, cells, query_ceiling(model), peak_rss_mb, n, max_new_tokens, repeats, list(prefix_cache)
    )
    for row in out["rows"]:
        row["request_rate"] = request_rate
    out["auto_vs_best_fixed"] = auto_vs_best_fixed(out["rows"], [c.name for c in cfgs if is_auto(c)])
    out.update(
        shared_prefix=shared_prefix,
        kv_budget_tokens=kv_budget_tokens,
        kv_page_size=kv_page_size,
        request_rate=request_rate,
    )
    if simulate is not None:
        out["projected"] = simulate
    return out

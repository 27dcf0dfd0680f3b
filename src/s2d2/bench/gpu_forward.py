"""The forward at the GPU's pace, measured in one run: replayed vs eager forwards, launches, the engine.

On a model built from a config with random weights (the SDAR-8B shape in ``scripts/shapes``), for each
(rows x query tokens) cell at a fixed context: milliseconds per forward eager and replayed (CUDA graphs;
on the CPU the static-buffer replay emulation), the largest logit difference between the two, and
kernel launches per forward (CUDA runtime launch calls under the profiler; on the CPU, kernel-launching
aten ops). Then the engine end to end: AR output tokens/s at each row count on random prompts. The
compute floor of the largest cell (bf16 FLOPs at ``--peak-tflops``) is printed beside it.

    python -m s2d2.bench.gpu_forward --config-json scripts/shapes/sdar-8b.json --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..forward.segment import Segment
from .op_count import OpCounter

#: CUDA runtime/driver calls that start work on the device (what "a launch" counts)
_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync")


def _segments(adapter: Any, states: list, query: int, context: int) -> list[Segment]:
    gen = torch.Generator().manual_seed(query * 1000 + len(states))
    ids = torch.randint(0, adapter.info.vocab_size - 1, (query,), generator=gen)
    pos = torch.arange(context, context + query)
    mask = torch.ones(query, query, dtype=torch.bool).tril_()
    return [Segment(s, ids, pos, mask, keep=0, logit_rows=Segment.last_rows(query, query)) for s in states]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _launches(fn: Any, dev: torch.device) -> int:
    """Device launches of one call of ``fn`` (CUDA: runtime calls; CPU: kernel-launching aten ops)."""
    if dev.type != "cuda":
        with OpCounter() as c:
            fn()
        return c.total
    from torch.profiler import ProfilerActivity, profile

    _sync(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(dev)
    return sum(1 for e in prof.events() if e.name.startswith(_LAUNCH_CALLS))


def forward_cell(adapter: Any, rows: int, query: int, context: int, repeats: int) -> dict[str, Any]:
    """One cell: eager and replayed ms per forward, their largest logit difference, launches."""
    fast, dev = adapter.fast, adapter.device
    pool = fast.new_pool()
    states = [pool.new_state() for _ in range(rows)]
    for s in states:
        pool.ensure(s, context + query)
        s.length = context
    cell: dict[str, Any] = {"rows": rows, "query": query, "context": context}
    outs = {}
    for mode in ("eager", "replay"):
        if mode == "eager":
            fast.enforce_eager = True
        elif dev.type == "cuda":
            fast.enforce_eager = False
        else:  # the CPU: the static-buffer replay emulation
            fast.static = fast.static_runner(graphs=False, max_tokens=1 << 16)

        def once() -> list[torch.Tensor]:
            return fast.forward(pool, _segments(adapter, states, query, context))

        with torch.inference_mode():
            outs[mode] = [t.clone() for t in once()]  # warm-up (and capture)
            times = []
            for _ in range(repeats):
                _sync(dev)
                t0 = time.perf_counter()
                once()
                _sync(dev)
                times.append(time.perf_counter() - t0)
            cell[f"{mode}_ms"] = round(1000 * statistics.median(times), 3)
            cell[f"{mode}_launches"] = _launches(once, dev)
        cell[f"{mode}_replayed"] = fast.static is not None and fast.static.shape_for(
            fast_shape(fast, states, query)) is not None  # fmt: skip
    fast.enforce_eager = True
    cell["replay_vs_eager_max_abs"] = max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(outs["eager"], outs["replay"], strict=True)
    )
    return cell


def fast_shape(fast: Any, states: list, query: int) -> Any:
    from ..forward.forward_batch import shape_of

    n = len(states)
    return shape_of([s.length for s in states], [query] * n, query * n, 16)


def engine_ar(adapter: Any, rows: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    """AR output tokens/s of the engine with ``rows`` rows on ``rows`` random prompts (the second of two
    equal runs: the first captures the CUDA graphs of every shape the steps take)."""
    from ..config import DecodeConfig
    from ..engine.llm_engine import LLMEngine

    gen = torch.Generator().manual_seed(rows)
    prompts = [torch.randint(3, adapter.info.vocab_size - 2, (prompt_len,), generator=gen).tolist()
               for _ in range(rows)]  # fmt: skip
    prompts = [[t for t in p if t != adapter.info.mask_token_id] for p in prompts]
    cfg = DecodeConfig.build(decoder="ar", max_new_tokens=new_tokens, seed=0, ignore_eos=True)
    adapter.fast.enforce_eager = adapter.device.type != "cuda"
    LLMEngine(adapter, max_num_seqs=rows).generate(prompts, [cfg] * rows)  # warm-up: captures every shape
    engine = LLMEngine(adapter, max_num_seqs=rows)
    _sync(adapter.device)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [cfg] * rows)
    _sync(adapter.device)
    seconds = time.perf_counter() - t0
    tokens = sum(o.stats.generated_tokens for o in outs)
    adapter.fast.enforce_eager = True
    return {"rows": rows, "tokens": tokens, "seconds": round(seconds, 3),
            "tok_per_s": round(tokens / seconds, 1)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    from ..cost.measure import random_adapter

    p = argparse.ArgumentParser(prog="python -m s2d2.bench.gpu_forward", description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--cells", default="1x1,1x16,16x1,64x1,64x8,64x32", help="ROWSxQUERY,...")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--engine-rows", default="1,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200: 989)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    adapter = random_adapter(a.config_json, device=a.device, dtype=a.dtype)
    params = sum(t.numel() for t in adapter.model.parameters())
    out: dict[str, Any] = {"device": str(adapter.device), "params": params, "cells": [], "engine": []}
    for spec in a.cells.split(","):
        rows, query = (int(x) for x in spec.split("x"))
        cell = forward_cell(adapter, rows, query, a.context, a.repeats)
        cell["compute_floor_ms"] = round(2 * params * rows * query / (a.peak_tflops * 1e9), 3)
        out["cells"].append(cell)
        print(json.dumps(cell), flush=True)
    for rows in (int(r) for r in a.engine_rows.split(",")):
        row = engine_ar(adapter, rows, a.prompt_len, a.new_tokens)
        out["engine"].append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

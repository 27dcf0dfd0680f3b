"""A forward-cost model: milliseconds per forward by query length, context length and batch.

NFE counts forwards, but forwards differ in size: AR feeds a token or two per row, a draft a block, a
fused verification the span twice plus pre-draft groups. This module times one batched forward of the
lean path (:mod:`s2d2.forward.fastpath`) for every (batch, context, query) cell, on a checkpoint or on a
randomly initialised model built from a ``config.json`` (so an 8B-shaped model can be timed without its
weights), and projects the wall speed-up of bench configurations from their NFE and query-token mix:

    time per token(config) = NFE/token x t(query tokens per forward, context, batch)

against AR's time per token at the same context and batch, where ``t`` is interpolated linearly in the
query length between measured points.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import S2D2Error
from ..families.hf import HFAdapter
from ..forward.segment import Segment


def random_adapter(config_path: str | Path, *, device: str | None = None, dtype: str | None = None) -> Any:
    """The adapter of a model built from ``config_path`` (a family's config.json) with random weights."""
    from ..families import detect_family
    from ..families.base import ModelInfo
    from ..families.checkpoint import resolve_device, resolve_dtype

    path = Path(config_path)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise S2D2Error(f"cannot read the config {path}: {exc}") from None
    fam = detect_family(config, path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    import transformers

    native = fam.SPEC.parse_config(path, config)
    cls = getattr(transformers, fam.SPEC.native_class)
    with torch.device(dev):
        model = cls._from_config(native, dtype=dt, attn_implementation="sdpa")
    info = ModelInfo(
        family=fam.FAMILY,
        mask_token_id=int(config.get("mask_token_id") or native.vocab_size - 1),
        eos_token_ids=[],
        vocab_size=native.vocab_size,
        max_length=int(native.max_position_embeddings),
    )
    return HFAdapter(model.eval(), info)


def time_forward(adapter: Any, batch: int, context: int, query: int, repeats: int = 5) -> float:
    """Median milliseconds of one forward: ``batch`` rows, each ``query`` new tokens after ``context``
    cached positions (the cache holds zeros: the time does not depend on its values)."""
    pool = adapter.new_pool()
    states = [pool.new_state() for _ in range(batch)]
    vocab = adapter.info.vocab_size
    ids = torch.randint(0, vocab, (query,))
    ids[ids == adapter.info.mask_token_id] = 0
    pos = torch.arange(context, context + query)
    mask = torch.ones(query, query, dtype=torch.bool)
    for s in states:
        s.length = context
    times = []
    sync = torch.cuda.synchronize if adapter.device.type == "cuda" else (lambda: None)
    for _ in range(repeats + 1):
        segs = [
            Segment(s, ids, pos, mask, keep=0, logit_rows=Segment.last_rows(query, query)) for s in states
        ]
        sync()
        t0 = time.perf_counter()
        adapter.run_and_keep(segs)
        sync()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[1:])


def measure(
    adapter: Any,
    queries: Sequence[int],
    contexts: Sequence[int],
    batches: Sequence[int],
    repeats: int = 5,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Every (batch, context, query) cell that fits the model's context: ms per forward and per token."""
    rows = []
    for b in batches:
        for c in contexts:
            for q in queries:
                if c + q > adapter.info.max_length:
                    continue
                ms = time_forward(adapter, b, c, q, repeats)
                rows.append({"batch": b, "context": c, "query": q, "ms": round(ms, 3)})
                if progress is not None:
                    progress()
    return rows


def interpolate(rows: list[dict[str, Any]], batch: int, context: int, query: float) -> float | None:
    """ms per forward at ``query`` tokens (linear between measured query lengths; clamped at the ends)."""
    pts = sorted((r["query"], r["ms"]) for r in rows if r["batch"] == batch and r["context"] == context)
    if not pts:
        return None
    if query <= pts[0][0]:
        return pts[0][1]
    for (q0, t0), (q1, t1) in zip(pts, pts[1:], strict=False):
        if query <= q1:
            return t0 + (t1 - t0) * (query - q0) / (q1 - q0)
    return pts[-1][1] * query / pts[-1][0]  # past the largest: proportional


def project(rows: list[dict[str, Any]], results: dict[str, Any], batch: int, context: int) -> list[dict]:
    """Projected wall speed-up vs AR of each run in a bench ``results.json`` (needs an ``ar`` run)."""
    runs = results.get("runs", [])
    ar = next((r for r in runs if r.get("decoder") == "ar"), None)
    if ar is None or ar.get("query_tokens_per_forward") is None:
        raise S2D2Error(
            "the bench results need an AR run with query_tokens_per_forward (s2d2 bench, this version)"
        )

    def per_token(r: dict[str, Any]) -> float | None:
        t = interpolate(rows, batch, context, r["query_tokens_per_forward"])
        return None if t is None else r["nfe_per_token"] * t

    base = per_token(ar)
    out = []
    for r in runs:
        if r.get("query_tokens_per_forward") is None:
            continue
        t = per_token(r)
        out.append(
            {
                "name": r["name"],
                "nfe_per_token": r["nfe_per_token"],
                "query_tokens_per_forward": r["query_tokens_per_forward"],
                "ms_per_token": None if t is None else round(t, 4),
                "projected_speedup_vs_ar": None if not (t and base) else round(base / t, 2),
            }
        )
    return out

"""Timing forwards shaped like real engine steps, through the runner's own path.

The uniform calibration (:func:`~s2d2.cost.measure.measure`) times every row feeding the same query
tokens after the same context. A real step mixes rows: AR decodes, drafts of a block (after a pending
token), plain and fused verifications (two halves plus pre-draft groups), prefill chunks, at different
cached lengths. :func:`measure_mixed` builds such steps with the adapter's own segment builders (the
segments the engine builds), runs them through ``adapter.run`` (the path the engine's forward takes: the
packed :class:`~s2d2.forward.forward_batch.ForwardBatch` forward and, on CUDA, the graph buckets, eager
above the largest) and records each step as a cell the fit reads: its rows' query tokens, cached
lengths and attention groups (as the engine describes a step: ``StepShape.of`` over
:func:`~s2d2.forward.attention_groups.split_by_length`) and its median milliseconds.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..forward.attention_groups import split_by_length
from ..forward.segment import Predraft, Segment
from ..layouts import family
from .step_cost import StepShape

#: The mixes a calibration times: rows per step and the kinds their rows take (cycled over the rows).
MIXES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, ("draft",)),
    (1, ("verify",)),
    (1, ("fused",)),
    (2, ("ar", "prefill")),
    (4, ("draft", "verify", "ar", "fused")),
    (8, ("draft", "draft", "verify", "fused")),
    (16, ("ar",)),
    (16, ("draft", "verify", "fused", "ar")),
    (16, ("draft", "fused", "fused", "verify", "prefill")),
    (32, ("draft", "verify")),
    (64, ("ar", "ar", "draft", "verify")),
    (64, ("draft", "fused", "verify")),
)
#: Block size of the drafts and verifications; tokens of a prefill chunk.
BLOCK, PREFILL = 8, 64


def _kind_segment(adapter: Any, state: Any, kind: str, rng: random.Random) -> Segment:
    """A row's segment of ``kind`` at ``state.length`` with random token ids (never the mask token)."""
    info = adapter.info
    mask_id, vocab = info.mask_token_id, info.vocab_size

    def tokens(n: int) -> list[int]:
        return [t if t != mask_id else 0 for t in (rng.randrange(vocab) for _ in range(n))]

    at = state.length
    if kind == "ar":  # one token in, its next-token row out
        return Segment(state, tokens(1), [at], torch.ones(1, 1, dtype=torch.bool), keep=1,
                       logit_rows=Segment.last_rows(1, 1))  # fmt: skip
    if kind == "prefill":
        ids = torch.tensor(tokens(PREFILL))
        return Segment.of(state, family.prefill(info, at, ids, block_size=BLOCK, causal=False))
    if kind == "draft":  # a pending token, then a block of mask tokens
        block = [mask_id] * BLOCK
        lay = family.draft(info, at, tokens(1), block, start=at + 1, block_size=BLOCK, causal=False)
        return Segment.of(state, lay)
    k = rng.randint(2, BLOCK)
    filled = tokens(BLOCK)
    if kind == "verify":
        return Segment.of(state, family.verify(info, at, filled, start=at, slots=list(range(1, k))))
    groups = [Predraft([filled[j], *[mask_id] * (BLOCK - j - 1)], list(range(at + j, at + BLOCK)), j)
              for j in range(1, k)]  # fmt: skip
    lay = family.fused(info, at, filled, start=at, slots=list(range(1, k)), predrafts=groups)
    return Segment.of(state, lay)


def time_step(adapter: Any, make: Callable[[], list[Segment]], repeats: int) -> tuple[float, StepShape]:
    """Median milliseconds of ``adapter.run(make())`` (segments made afresh each time, their rows' cached
    lengths restored), after one warm-up; and the step's shape as the engine describes it."""
    segs = make()
    lengths = [s.state.length for s in segs]
    shape = StepShape.of([s.n for s in segs], lengths, split_by_length(segs))
    sync = torch.cuda.synchronize if adapter.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        for s, n in zip(segs, lengths, strict=True):
            s.state.length = n
        segs = make()
        for s in segs:  # pages for what the forward writes (the engine's scheduler takes them)
            s.state.cache.ensure(s.state, s.state.length + s.n)
        sync()
        t0 = time.perf_counter()
        adapter.run(segs)
        sync()
        times.append(time.perf_counter() - t0)
    for s, n in zip(segs, lengths, strict=True):
        s.state.length = n
    return 1000 * statistics.median(times[1:]), shape


def measure_mixed(
    adapter: Any,
    contexts: Sequence[int] = (32, 192),
    repeats: int = 3,
    mixes: Sequence[tuple[int, Sequence[str]]] = MIXES,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One cell per (mix, context spread) that fits the model: each row's cached length drawn between
    the smallest and each larger of ``contexts``; ``queries``, ``contexts``, ``groups`` (padded
    ``(rows, queries, keys)`` each) and ``ms``, as :meth:`~s2d2.cost.step_cost.FittedCost.fit` reads."""
    rng = random.Random(seed)
    cells = []
    lo = min(contexts)
    for hi in sorted(contexts):
        for rows, kinds in mixes:
            if hi + PREFILL + 2 * BLOCK > adapter.info.max_length:
                continue
            pool = adapter.new_pool()
            states = [pool.new_state() for _ in range(rows)]
            for st in states:
                st.length = rng.randint(lo, hi)
                pool.ensure(st, st.length)
            seed_r = rng.randrange(1 << 30)

            def make(states=states, kinds=kinds, seed_r=seed_r) -> list[Segment]:
                r = random.Random(seed_r)
                return [_kind_segment(adapter, st, kinds[i % len(kinds)], r) for i, st in enumerate(states)]

            ms, shape = time_step(adapter, make, repeats)
            cells.append({"queries": list(shape.queries), "contexts": list(shape.contexts),
                          "groups": [list(g) for g in shape.groups], "ms": round(ms, 3),
                          "kinds": list(kinds)})  # fmt: skip
    return cells

#!/usr/bin/env python3
"""Forward time of the paged forward against the previous grouped one, paired on real engine steps.

    PYTHONPATH=src python scripts/compare_forward_paths.py CONFIG ROWS [N]

Decodes N (default 64) tiny-gsm test problems with the bench configuration CONFIG on ROWS rows, one
thread. Every forward runs twice on the same segments and cache: once on the paged path
(``FastDecoder.forward``) and once on the grouped path (``FastDecoder.grouped_forward``), in alternating
order; both write the same keys and values, and the decoding continues from the paged path's logits.
Prints the forwards and each path's mean milliseconds a forward.
"""

from __future__ import annotations

import collections
import sys
import time

import torch

import s2d2
from s2d2.bench.suites import load_problems
from s2d2.bench.throughput import pick_configs
from s2d2.forward import fastpath


def main(config: str, rows: int, n: int = 64) -> None:
    torch.set_num_threads(1)
    model = s2d2.load("tiny-gsm")
    prompts = [model.encode(p["question"]) for p in load_problems("tiny-gsm", "test", n)]
    (bench,) = pick_configs([config])
    cfg = model.make_config(model.checkpoint_config(), **bench.expanded(), seed=0, max_new_tokens=64)
    paged = fastpath.FastDecoder.forward
    spent: collections.Counter[str] = collections.Counter()
    count = [0]

    def both(self, pool, segments):
        count[0] += 1
        order = ("paged", "grouped") if count[0] % 2 else ("grouped", "paged")
        for name in order:
            t0 = time.perf_counter()
            out = paged(self, pool, segments) if name == "paged" else self.grouped_forward(pool, segments)
            spent[name] += time.perf_counter() - t0
            if name == "paged":
                logits = out
        return logits

    fastpath.FastDecoder.forward = both
    model.max_num_seqs = rows
    model.generate_batch(prompts, cfg)
    ms = {name: round(1000 * t / count[0], 2) for name, t in spent.items()}
    print(f"{config} rows {rows}: {count[0]} forwards, ms a forward {ms}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))

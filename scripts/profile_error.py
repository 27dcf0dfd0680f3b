#!/usr/bin/env python3
"""How well a step-cost profile prices a real mixed run: the uniform calibration against the one that
also times steps shaped like the engine's (``s2d2.cost.mixed_steps``), on the same machine.

    PYTHONPATH=src python scripts/profile_error.py [N] [ROWS,...]

Calibrates both profiles of the built-in model (one thread), then decodes N (default 64) tiny-gsm test
problems on each ROWS (default 1,16,64), requests cycling AR, lossless B8, lossless-fused B8 and lossless
B16 (fixed configurations: a profile prices the steps but chooses nothing). Each run is made twice, once
with each profile as the engine's ``cost=``; it prints ``LLMEngine.stats()['predicted_abs_error']`` (the
median |predicted - measured| / measured over the run's forwards) of the engine's profile, and the other
profile's error on the same forwards (paired: the same measured times, so this machine's timing noise
does not decide which profile looks better).
"""

from __future__ import annotations

import sys

import torch

import s2d2
from s2d2.bench.suites import load_problems
from s2d2.cost.measure import measure
from s2d2.cost.mixed_steps import measure_mixed
from s2d2.cost.step_cost import CALIBRATION, FittedCost, median_abs_error
from s2d2.engine.llm_engine import LLMEngine

MIX = (
    dict(decoder="ar"),
    dict(preset="lossless", block_size=8),
    dict(preset="lossless-fused", block_size=8),
    dict(preset="lossless", block_size=16),
)


class Paired:
    """``primary``'s predictions for the engine; ``other``'s recorded beside them, step by step."""

    def __init__(self, primary, other):
        self.primary, self.other, self.others = primary, other, []

    def predict_ms(self, shape):
        self.others.append(self.other.predict_ms(shape))
        return self.primary.predict_ms(shape)

    def predict_totals(self, *args):
        return self.primary.predict_totals(*args)


def main(n: int = 64, rows: tuple[int, ...] = (1, 16, 64)) -> None:
    torch.set_num_threads(1)
    model = s2d2.load("tiny-gsm", use_preset=False)
    ad = model.adapter
    g = CALIBRATION
    uniform = measure(ad, g["query"], g["context"], g["batch"], 3)
    mixed = measure_mixed(ad, g["context"], 3)
    profiles = {"uniform": FittedCost.fit(uniform), "uniform+steps": FittedCost.fit(uniform + mixed)}
    for name, prof in profiles.items():
        print(f"{name}: coef {[round(c, 5) for c in prof.coef]}")
    prompts = [model.encode(p["question"]) for p in load_problems("tiny-gsm", "test", n)]
    cfgs = [model.make_config(max_new_tokens=48, **MIX[i % len(MIX)]) for i in range(n)]
    (a, pa), (b, pb) = profiles.items()
    for r in rows:
        for (name, prof), (other, oprof) in (((a, pa), (b, pb)), ((b, pb), (a, pa))):
            cost = Paired(prof, oprof)
            engine = LLMEngine(ad, max_num_seqs=r, cost=cost)
            engine.generate(prompts, cfgs)
            st = engine.stats()
            measured = [m for _, m in engine.timing.pairs]
            paired = median_abs_error(list(zip(cost.others, measured, strict=True)))
            error = st["predicted_abs_error"]
            print(f"rows {r}: cost={name}: predicted_abs_error {error:.3f}; {other} on the same "
                  f"{len(measured)} forwards {paired:.3f}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 64, tuple(map(int, args[1].split(","))) if len(args) > 1 else (1, 16, 64))

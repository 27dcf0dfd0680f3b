"""Structured output on the built-in model: 100 test problems under an answer-line regex and a
choice, constrained vs unconstrained (match rate, lossless == AR, NFE/token, accuracy, tokens/s at 16 rows).

    PYTHONPATH=src python scripts/structured_bench.py [N]
"""

from __future__ import annotations

import re
import sys
import time

import s2d2
from s2d2.evaluation.answers import extract_gsm8k_answer
from s2d2.tasks.tiny_gsm.splits import load_split

REGEX = r"[^#]*#### [0-9]+"


def run(m, qs, **kw):
    t = time.perf_counter()
    res = m.generate_batch(qs, max_new_tokens=64, **kw)
    sec = time.perf_counter() - t
    toks = sum(len(r.token_ids) for r in res)
    nfe = sum(r.stats.nfe for r in res)
    return res, toks / sec, nfe / max(toks, 1)


def main(n: int) -> None:
    probs = load_split("test")[:n]
    qs, gold = [p["question"] for p in probs], [p["final"] for p in probs]
    m = s2d2.load("tiny-gsm", max_num_seqs=16)
    m.generate_batch(qs[:16], max_new_tokens=8)  # warm up
    rows = {}
    for name, kw in {
        "ar": {"decoder": "ar"},
        "lossless": {"preset": "lossless"},
        "lossless-auto": {"preset": "lossless-auto"},
    }.items():
        for c, ckw in {"free": {}, "regex": {"regex": REGEX}}.items():
            rows[(name, c)] = run(m, qs, **kw, **ckw)
    for (name, c), (res, tps, nfe_tok) in rows.items():
        acc = sum(extract_gsm8k_answer(r.text) == g for r, g in zip(res, gold, strict=True)) / n
        match = sum(bool(re.fullmatch(REGEX, r.text)) for r in res) / n
        same = sum(r.token_ids == a.token_ids for r, a in zip(res, rows[("ar", c)][0], strict=True)) / n
        print(
            f"{name:14s} {c:6s} match {match:.2f} acc {acc:.2f} ==AR {same:.2f} "
            f"nfe/tok {nfe_tok:.3f} tok/s {tps:.1f}"
        )
    # a choice over candidate answers: the gold answer and three others drawn from the question's numbers
    choices = []
    for q, g in zip(qs, gold, strict=True):
        nums = [x for x in dict.fromkeys(re.findall(r"[0-9]+", q)) if x != g][:3]
        choices.append({"choice": sorted({g, *nums})})
    for name, kw in {"ar": {"decoder": "ar"}, "lossless": {"preset": "lossless"}}.items():
        res = m.generate_batch(qs, max_new_tokens=8, per_request=choices, **kw)
        ok = sum(r.text in c["choice"] for r, c in zip(res, choices, strict=True)) / n
        acc = sum(r.text == g for r, g in zip(res, gold, strict=True)) / n
        rows[(name, "choice")] = res
        print(f"{name:14s} choice in-set {ok:.2f} acc {acc:.2f}")
    same = sum(
        a.token_ids == b.token_ids
        for a, b in zip(rows[("ar", "choice")], rows[("lossless", "choice")], strict=True)
    )
    print(f"choice lossless == AR: {same}/{n}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)

"""The constraint probe grid against a real server: 13 decoders (the baselines, the default, the lossless
presets, the paper's SDAR presets and S2D2 under each routing policy) x 10 constraints (a choice, six
satisfiable regexes among them a dead-end word ``[a-z]+e``, a full stop and the model's own answer
format, two regexes the vocabulary provably cannot write, no constraint) x temperatures {0, 0.7, 1} x
``--seeds`` seeds, through the official ``openai`` client, ``--concurrency`` at a time.

Every request must end (a client timeout counts as a hang) without a 5xx. A satisfiable constraint must
not be refused (no 400, no 422), and its output, when it stopped, must match it; an unsatisfiable one
must be a 400 before decoding.

    PYTHONPATH=src python scripts/probe_grid.py [--timeout 10] [--seeds 8] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import collections
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

import s2d2
from s2d2.serving.app import create_app
from s2d2.serving.server import make_server

PROMPT = "Ben has 3 apples. He buys 2 more. How many apples does Ben have?"
DECODERS = {
    "ar": {"decoder": "ar"},
    "static": {"decoder": "static"},
    "dynamic": {"decoder": "dynamic"},
    "eb": {"decoder": "eb"},
    "default": {},
    "lossless": {"preset": "lossless"},
    "lossless-fused": {"preset": "lossless-fused"},
    "paper-sdar-a": {"preset": "paper-sdar-a"},
    "paper-sdar-b": {"preset": "paper-sdar-b"},
    **{f"s2d2-{p}": {"decoder": "s2d2", "policy": p} for p in ("score", "hysteresis", "min-span", "ucb")},
}
ANSWER = r"[0-9]+ [+] [0-9]+ = [0-9]+\. #### [0-9]+"
CHOICE = ["5 apples", "12 apples", "avocado pie", "5"]
SENTENCE = r"[A-Z][a-z]+ has [0-9]+ apples[.!]"


def _regex(rx: str, satisfiable: bool = True) -> tuple[dict, str | None, bool]:
    return {"guided_regex": rx}, rx if satisfiable else None, satisfiable


#: name -> (request fields, the regex a stopped output must match (None: any), satisfiable)
CONSTRAINTS = {
    "choice": ({"guided_choice": CHOICE}, "5 apples|12 apples|5", True),
    "regex-alt": _regex("67|42|5 apples"),
    "regex-num": _regex("[0-9]+ apples"),
    "dead-end-word": _regex("[a-z]+e"),
    "full-stop": _regex(r"5\."),
    "sentence": _regex(SENTENCE),
    "answer-format": _regex(ANSWER),
    "unsat-x": _regex("[0-9]+x", satisfiable=False),
    "unsat-40x": _regex("[0-9]{40}x", satisfiable=False),
    "none": ({}, None, True),
}


def _serve(model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server(create_app(model, max_num_seqs=8, max_queue=64), host="127.0.0.1", port=port,
                         log_level="warning")  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}/v1"


def _one(client, settings, extra, pattern, satisfiable, temperature, seed) -> tuple[list[str], float]:
    """One request: its outcome buckets and its seconds."""
    t = time.perf_counter()
    try:
        out = client.completions.create(
            model="tiny-gsm", prompt=PROMPT, max_tokens=20, temperature=temperature, seed=seed,
            extra_body={**extra, "s2d2": settings},
        )  # fmt: skip
        c = out.choices[0]
        if not satisfiable:
            return ["unsatisfiable answered 200"], time.perf_counter() - t
        ok = pattern is None or c.finish_reason != "stop" or re.fullmatch(pattern, c.text)
        return ["ok" if ok else "violations", f"finish {c.finish_reason}"], time.perf_counter() - t
    except openai.APITimeoutError:
        return ["hangs"], time.perf_counter() - t
    except openai.APIStatusError as exc:
        code = exc.status_code
        if code >= 500:
            return ["5xx"], time.perf_counter() - t
        if not satisfiable and code == 400:
            return ["unsatisfiable refused (400)"], time.perf_counter() - t
        bucket = f"{code} on a satisfiable constraint" if satisfiable else f"unsatisfiable {code}"
        return [bucket], time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds a request may take (else a hang)")
    ap.add_argument("--seeds", type=int, default=8, help="seeds per decoder, constraint and temperature")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    args = ap.parse_args()
    model = s2d2.load("tiny-gsm", max_num_seqs=8)
    server, url = _serve(model)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=args.timeout)
    jobs = [
        (settings, extra, pattern, sat, temperature, seed)
        for settings in DECODERS.values()
        for extra, pattern, sat in CONSTRAINTS.values()
        for temperature in (0.0, 0.7, 1.0)
        for seed in range(args.seeds)
    ]
    counts: collections.Counter[str] = collections.Counter()
    slowest, t0 = 0.0, time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        for buckets, seconds in pool.map(lambda job: _one(client, *job), jobs):
            counts.update(buckets)
            slowest = max(slowest, seconds)
    server.should_exit = True
    refused = counts["unsatisfiable refused (400)"]
    print(f"{len(jobs)} requests in {time.perf_counter() - t0:.1f}s, slowest {slowest:.2f}s")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    bad_sat = sum(v for k, v in counts.items() if k.endswith("on a satisfiable constraint"))
    print(f"5xx: {counts['5xx']}, hangs: {counts['hangs']}, violations: {counts['violations']}, "
          f"4xx on satisfiable: {bad_sat}, unsatisfiable refused with 400: {refused}")  # fmt: skip


if __name__ == "__main__":
    main()

"""The constraint probe grid against a real server (issue 60): 7 decoders x {a choice, 2 regexes, none} x
temperatures {0, 0.7, 1} x 8 seeds = 672 requests through the official ``openai`` client. Every request
must end (a client timeout counts as a hang) without a 5xx; a constrained output that stopped must match
its constraint.

    PYTHONPATH=src python scripts/probe_grid.py [--timeout 10]
"""

from __future__ import annotations

import argparse
import collections
import re
import socket
import threading
import time

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
}
CONSTRAINTS = {
    "choice": ({"guided_choice": ["5 apples", "12 apples", "avocado pie", "5"]}, r"5 apples|12 apples|5"),
    "regex-alt": ({"guided_regex": "67|42|5 apples"}, r"67|42|5 apples"),
    "regex-num": ({"guided_regex": "[0-9]+ apples"}, r"[0-9]+ apples"),
    "none": ({}, None),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds a request may take (else a hang)")
    args = ap.parse_args()
    model = s2d2.load("tiny-gsm", max_num_seqs=8)
    server, url = _serve(model)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=args.timeout)
    counts: collections.Counter[str] = collections.Counter()
    slowest, t0 = 0.0, time.perf_counter()
    for dname, settings in DECODERS.items():
        for cname, (extra, pattern) in CONSTRAINTS.items():
            for temperature in (0.0, 0.7, 1.0):
                for seed in range(8):
                    t = time.perf_counter()
                    try:
                        out = client.completions.create(
                            model="tiny-gsm", prompt=PROMPT, max_tokens=20, temperature=temperature,
                            seed=seed, extra_body={**extra, "s2d2": settings},
                        )  # fmt: skip
                        c = out.choices[0]
                        ok = pattern is None or c.finish_reason != "stop" or re.fullmatch(pattern, c.text)
                        counts["ok" if ok else "violations"] += 1
                        counts[f"finish {c.finish_reason}"] += 1
                    except openai.APITimeoutError:
                        counts["hangs"] += 1
                    except openai.APIStatusError as exc:
                        counts["5xx" if exc.status_code >= 500 else f"{exc.status_code}"] += 1
                    slowest = max(slowest, time.perf_counter() - t)
    server.should_exit = True
    total = sum(v for k, v in counts.items() if not k.startswith("finish"))
    print(f"{total} requests in {time.perf_counter() - t0:.1f}s, slowest {slowest:.2f}s")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"5xx: {counts['5xx']}, hangs: {counts['hangs']}, violations: {counts['violations']}")


if __name__ == "__main__":
    main()

"""Ray Serve scale-out: two replicas of the same app behind Ray's HTTP proxy, on the local machine."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
try:
    import ray
    from ray import serve
except ImportError:  # pragma: no cover - depends on the machine
    pytest.skip("Ray Serve is not installed (pip install 's2d2[ray]')", allow_module_level=True)

from s2d2.serving.ray import run  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_answer_through_the_ingress():
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        run("tiny-gsm", host="127.0.0.1", port=port, replicas=2, num_cpus=1, max_num_seqs=4)
        base = f"http://127.0.0.1:{port}"
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"only replicas {seen} answered"
            resp = httpx.get(base + "/health", timeout=10)
            assert resp.status_code == 200
            seen.add(resp.json()["replica"])
        body = {"prompt": "Tom has 3 apples. He buys 4 more. How many apples does he have?", "max_tokens": 32}
        for _ in range(4):
            out = httpx.post(base + "/v1/completions", json=body, timeout=30)
            assert out.status_code == 200 and out.json()["choices"][0]["text"]
        bad = httpx.post(base + "/v1/completions", json={"prompt": "hi", "n": 0}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    finally:
        serve.shutdown()
        ray.shutdown()

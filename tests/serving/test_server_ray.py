"""Ray Serve scale-out: two replicas of the same app behind Ray's HTTP proxy, on the local machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
try:
    import ray
    from ray import serve
except ImportError:  # pragma: no cover - depends on the machine
    pytest.skip("Ray Serve is not installed (pip install 's2d2[ray]')", allow_module_level=True)

from test_server import free_port  # noqa: E402

from s2d2.serving.ray import run  # noqa: E402

pytestmark = pytest.mark.slow


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


def _processes_with(marker: str) -> list[tuple[int, str]]:
    """Every process whose environment holds ``marker`` (pid, command line): the Ray processes a
    ``s2d2 serve --ray`` started with that marker in its environment inherit it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace")[:120]))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _probe_until_refused(base: str, body: dict, seen: list, refused: list) -> None:
    """New requests after the stop signal, until the connection is refused (its time in ``refused``),
    one is neither a 200 nor a 503 (kept last in ``seen``), or 20 s."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            seen.append(httpx.post(base + "/v1/completions", json=body, timeout=30))
        except httpx.TransportError:
            refused.append(time.monotonic())
            return
        if seen[-1].status_code not in (200, 503):
            return
        time.sleep(0.05)


def _wait_gone(marker: str, timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_ray_stops_on_a_signal_with_exit_0_and_no_ray_process_left(sig):
    """``s2d2 serve --ray`` on SIGTERM / Ctrl-C: Ray Serve's and Ray's own shutdown of the cluster it
    started, exit 0, the open stream closed, and none of that cluster's processes left running."""
    if ray.is_initialized():
        ray.shutdown()  # this process's own cluster (the test above) is not the one under test
    port = free_port()
    marker = f"S2D2_RAY_TEST={uuid.uuid4().hex}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", marker.split("=")[0]: marker.split("=")[1]}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--ray", "--port", str(port), "--max-num-seqs", "2"]
    # a grace the 400-token stream ends well within on a loaded 2-core machine (the replicas stop as soon
    # as they are idle, so a longer grace costs nothing when the stream ends early)
    cmd += ["--grace", "30", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "s2d2 serve --ray did not start"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert _processes_with(marker), "the marker does not reach the Ray processes"
        body = {"prompt": "Tom has 3 apples. He buys 4 more. How many apples does he have?", "max_tokens": 8}
        out = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] > 0
        long = {**body, "max_tokens": 400, "stream": True, "s2d2": {"decoder": "ar", "ignore_eos": True}}
        lines: list[str] = []
        during: list[httpx.Response] = []
        refused: list[float] = []
        probe_args = (base, body, during, refused)
        prober = threading.Thread(target=_probe_until_refused, args=probe_args, daemon=True)
        with httpx.stream("POST", base + "/v1/completions", json=long, timeout=120) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(line)
                if len(lines) == 1:
                    proc.send_signal(sig)
                    prober.start()
        ended = time.monotonic()
        data = [line for line in lines if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and len(data) > 2, data[-3:]
        assert not any('"error"' in line for line in data)  # it ran to its end within the grace
        prober.join(30)
        # a request that arrives while the replicas drain: 503 + Retry-After (as the plain server), not 404
        assert during and during[-1].status_code == 503, [r.status_code for r in during]
        assert during[-1].headers.get("retry-after") and during[-1].json()["error"]["code"] == "draining"
        # 503 throughout the drain: connections are refused only once the running stream has ended
        assert not refused or refused[0] >= ended, (refused[0] - ended, [r.status_code for r in during])
        output = proc.communicate(timeout=120)[0].decode()
        assert proc.returncode == 0, output[-3000:]
        # (Ray's raylet may still log "ServeController.graceful_shutdown failed ... killed by ray.kill":
        # the controller ends its own graceful shutdown so; what must not appear is a crash)
        assert "Traceback" not in output and "SIGABRT" not in output, output[-3000:]
        left = _wait_gone(marker, 30)
        assert not left, f"Ray processes left running: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for pid, _ in _processes_with(marker):  # only this test's own processes
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

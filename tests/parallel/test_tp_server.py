"""``s2d2 serve -tp 2``: a real server whose model runs over two ranks (the second a spawned process).

Streamed and plain requests from the official ``openai`` client get the same text as ``s2d2 serve``
(one process); SIGTERM stops the server with exit 0 and no rank process left; a killed rank fails the
running request with a clear error, ``/health`` stops answering 200 and the server exits with status 4.
``serve --ray -tp 2`` does the same on a local Ray cluster. Rank processes are found by their
environment: this module's marker (which every process the server starts inherits) and ``S2D2_TP_RANK``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.tensor_parallel, pytest.mark.server]

PROMPTS = [
    "Tom has 3 apples. He buys 4 more. How many apples does he have?",
    "A box holds 6 pens. Sam takes 2 pens. How many pens are left?",
    "Ann reads 5 pages a day for 3 days. How many pages does she read?",
]
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with(*entries: str) -> list[int]:
    """Processes whose environment holds every one of ``entries`` (``NAME=VALUE``)."""
    found = []
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(e.encode() in env for e in entries):
            found.append(pid)
    return found


class Server:
    def __init__(self, *args: str, timeout_s: float | None = None):
        self.port, self.marker = _free_port(), f"S2D2_TP_TEST={uuid.uuid4().hex}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
        env.update([self.marker.split("=")])
        env.pop("RAY_ADDRESS", None)
        if timeout_s is not None:
            env["S2D2_TP_TIMEOUT_S"] = str(timeout_s)
        cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--port", str(self.port), "--max-num-seqs", "4"]
        cmd += ["--grace", "5", "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, self.proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "s2d2 serve did not start"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0)

    def ranks(self) -> list[int]:
        return _processes_with(self.marker, "S2D2_TP_RANK=1")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for pid in _processes_with(self.marker):  # this test's own processes only
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _answers(server: Server) -> list[tuple[str, str]]:
    out = []
    for prompt in PROMPTS:
        kw = dict(model="tiny-gsm", prompt=prompt, max_tokens=24, temperature=0)
        plain = server.client.completions.create(**kw)
        chunks = server.client.completions.create(**kw, stream=True)
        out.append((plain.choices[0].text, "".join(c.choices[0].text for c in chunks if c.choices)))
    return out


@pytest.fixture(scope="module")
def one_process_answers():
    server = Server()
    try:
        yield _answers(server)
    finally:
        server.close()


def test_tp2_server_answers_as_tp1_and_stops_on_sigterm(one_process_answers):
    server = Server("-tp", "2")
    try:
        assert len(server.ranks()) == 1
        got = _answers(server)
        assert got == one_process_answers and all(a and b for a, b in got)
        server.proc.send_signal(signal.SIGTERM)
        output = server.proc.communicate(timeout=60)[0].decode()
        assert server.proc.returncode == 0, output[-3000:]
        deadline = time.monotonic() + 10
        while (left := _processes_with(server.marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left running: {left}"
    finally:
        server.close()


def test_a_killed_rank_fails_the_running_request_and_the_server_exits():
    server = Server("-tp", "2")
    try:
        (rank,) = server.ranks()
        long = {"prompt": PROMPTS[0], "max_tokens": 400, "stream": True,
                "s2d2": {"decoder": "ar", "ignore_eos": True}}  # fmt: skip
        lines: list[str] = []
        with httpx.stream("POST", server.base + "/v1/completions", json=long, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(line)
                if len(lines) == 1:
                    os.kill(rank, signal.SIGKILL)
        errors = [line for line in lines if '"error"' in line]
        assert errors and "a tensor-parallel rank failed; the server is stopping" in errors[-1], lines[-3:]
        assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"
        late = _late_answer(server)  # a request arriving while the group fails
        for text in [*errors, late]:  # what a client reads: no torch or gloo text, no source path
            assert not any(w in text.lower() for w in ("gloo", "pytorch", "torch", ".py", ".cpp", "/")), text
        output = server.proc.communicate(timeout=60)[0].decode()
        assert "gloo" in output.lower() or "rank" in output, output[-3000:]  # the details: the log
        assert server.proc.returncode == 4, output[-3000:]
        assert not _processes_with(server.marker)
    finally:
        server.close()


def _late_answer(server: Server) -> str:
    """A request sent right after the rank died: a 503 with Retry-After (or no connection once the server
    is gone); its body as text."""
    body = {"model": "tiny-gsm", "prompt": PROMPTS[1], "max_tokens": 4}
    try:
        resp = httpx.post(server.base + "/v1/completions", json=body, timeout=30)
    except httpx.TransportError:
        return ""
    assert resp.status_code == 503 and resp.headers.get("retry-after"), (resp.status_code, resp.text)
    return resp.text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_no_rank_outlives_the_server(sig):
    """Ctrl-C stops the server with exit 0 and its rank; a server killed outright (no shutdown of its
    own) leaves no rank either: a rank exits when the driver's process is gone."""
    server = Server("-tp", "2")
    try:
        assert len(server.ranks()) == 1
        server.proc.send_signal(sig)
        server.proc.communicate(timeout=60)
        assert server.proc.returncode == (0 if sig == signal.SIGINT else -signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (left := _processes_with(server.marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left running: {left}"
    finally:
        server.close()


@pytest.mark.slow
def test_serve_ray_tp2_answers_as_tp1_and_stops_with_exit_0(one_process_answers):
    """``s2d2 serve --ray -tp 2`` on a local Ray cluster of its own: one replica whose model runs over two
    ranks; the same answers; SIGTERM stops it with exit 0 and leaves none of its processes (Ray's, the
    replica's rank) running."""
    pytest.importorskip("ray")
    server = Server("--ray", "-tp", "2")
    try:
        got = _answers(server)
        assert got == one_process_answers
        assert len(server.ranks()) == 1
        server.proc.send_signal(signal.SIGTERM)
        output = server.proc.communicate(timeout=120)[0].decode()
        assert server.proc.returncode == 0, output[-3000:]
        deadline = time.monotonic() + 30
        while (left := _processes_with(server.marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes left running: {left}"
    finally:
        server.close()

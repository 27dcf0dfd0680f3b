"""`s2d2 serve`: a real uvicorn server on 127.0.0.1 driven by the official openai client and httpx."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.serving.server import make_server  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:32]]
#: a long request: the AR decoder (one token per forward) past EOS, so it is still running when we act
LONG = {"decoder": "ar", "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(app, timeout: float = 30.0, **options):
    """A real uvicorn server for ``app`` on a free 127.0.0.1 port, in a thread: yields its URL, stops it."""
    port = free_port()
    server = make_server(app, host="127.0.0.1", port=port, log_level="warning", **options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=16)


@pytest.fixture(scope="module")
def expected(model):
    """Each question's greedy text from ``model.generate`` alone (computed before any server runs)."""
    return {q: model.generate(q, max_new_tokens=96).text for q in QUESTIONS}


@pytest.fixture(scope="module")
def url(model, expected):
    with running_server(create_app(model, max_num_seqs=16, max_queue=64)) as base:
        yield base


@pytest.fixture()
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def requests_total(url: str, status: str) -> float:
    return metric(url, f's2d2_requests_total{{status="{status}"}}')


# ---------------------------------------------------------------------------------------------- basics
def test_models_health_metrics(url, client):
    assert [m.id for m in client.models.list().data] == ["tiny-gsm"]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    text = httpx.get(url + "/metrics").text
    for name in (
        "s2d2_requests_total",
        "s2d2_forwards_total",
        "s2d2_nfe_per_token",
        "s2d2_running_rows",
        "s2d2_waiting_rows",
        "s2d2_batch_occupancy",
        "s2d2_verification_rate",
    ):
        assert f"# TYPE {name} " in text
    schema = httpx.get(url + "/openapi.json").json()
    props = schema["components"]["schemas"]["S2D2Settings"]["properties"]
    assert {"decoder", "preset", "policy", "threshold", "block_size"} <= set(props)


def test_greedy_streamed_equals_non_streamed_equals_generate(client, expected):
    for q in QUESTIONS[:3]:
        want = expected[q]
        full = client.completions.create(model="tiny-gsm", prompt=q, max_tokens=96, temperature=0)
        assert full.choices[0].text == want
        assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens > 0
        stats = full.model_extra["s2d2"]
        assert stats["nfe"] >= 1 and stats["nfe_per_token"] > 0 and "accepted" in stats
        chunks = list(client.completions.create(model="tiny-gsm", prompt=q, max_tokens=96, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_streamed_and_not(client, expected):
    q = QUESTIONS[0]
    msgs = [{"role": "user", "content": q}]
    full = client.chat.completions.create(model="tiny-gsm", messages=msgs, max_tokens=96)
    assert full.choices[0].message.content == expected[q]  # the fallback template: one question, bare
    assert full.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny-gsm", messages=msgs, max_tokens=96, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected[q]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_token_id_prompt_stop_strings_and_extension(client, model, expected):
    q = QUESTIONS[1]
    ids = model.encode(q)
    out = client.completions.create(model="tiny-gsm", prompt=ids, max_tokens=96)
    assert out.choices[0].text == expected[q]
    cut = client.completions.create(model="tiny-gsm", prompt=q, max_tokens=96, stop=["=", "####"])
    assert cut.choices[0].text == expected[q].split("=")[0] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny-gsm", prompt=q, max_tokens=96, stop="=", stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text
    ar = client.completions.create(
        model="tiny-gsm", prompt=q, max_tokens=96, extra_body={"s2d2": {"decoder": "ar"}}
    )
    want_ar = model.generate(q, max_new_tokens=96, decoder="ar")
    assert ar.choices[0].text == want_ar.text and ar.model_extra["s2d2"]["nfe"] == want_ar.stats.nfe
    lossless = client.completions.create(
        model="tiny-gsm",
        prompt=q,
        max_tokens=96,
        extra_body={"s2d2": {"preset": "lossless", "block_size": 8}},
    )
    assert lossless.choices[0].text == want_ar.text  # lossless = AR greedy output
    planned = client.completions.create(  # the block size chosen by load, from a JSON list
        model="tiny-gsm",
        prompt=q,
        max_tokens=96,
        extra_body={"s2d2": {"preset": "lossless-auto", "plan_block_sizes": [4, 16]}},
    )
    assert planned.choices[0].text == want_ar.text


# ---------------------------------------------------------------------------------------------- load
def test_32_concurrent_streaming_clients(url, expected):
    async def one(client, q):
        stream = await client.completions.create(model="tiny-gsm", prompt=q, max_tokens=96, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        return await asyncio.gather(*(one(client, q) for q in QUESTIONS), return_exceptions=True)

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert results == [expected[q] for q in QUESTIONS]


def test_disconnect_frees_the_row(url, client, expected):
    aborted = requests_total(url, "aborted")
    body = {"prompt": QUESTIONS[2], "max_tokens": 400, "stream": True, "s2d2": LONG}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert metric(url, "s2d2_running_rows") == 1
    # the connection is closed mid-stream: the request is aborted and its row freed
    deadline = time.monotonic() + 10
    while metric(url, "s2d2_running_rows") != 0 or requests_total(url, "aborted") != aborted + 1:
        assert time.monotonic() < deadline, "the disconnected request's row was not freed"
        time.sleep(0.02)
    out = client.completions.create(model="tiny-gsm", prompt=QUESTIONS[3], max_tokens=96)
    assert out.choices[0].text == expected[QUESTIONS[3]]


def test_one_request_failing_fails_it_alone(url, client, expected, monkeypatch):
    import s2d2.engine.step.postprocess as llm

    real = llm.apply

    def flaky(work):
        if work.req.config.seed == 666:
            raise RuntimeError("injected failure")
        return real(work)

    monkeypatch.setattr(llm, "apply", flaky)
    bad = httpx.post(url + "/v1/completions", json={"prompt": QUESTIONS[4], "seed": 666}, timeout=30)
    message = bad.json()["error"]["message"]
    assert bad.status_code == 500 and "internal error (request id req-" in message
    assert "injected" not in message  # the engine's own text goes to the log only
    good = client.completions.create(model="tiny-gsm", prompt=QUESTIONS[4], max_tokens=96, seed=1)
    assert good.choices[0].text == expected[QUESTIONS[4]]


# ---------------------------------------------------------------------------------------------- errors
TOO_LONG = list(range(5, 305)) * 2  # 600 valid token ids: longer than the 512-position context
BAD_REQUESTS = [
    ("malformed json", "/v1/completions", b'{"prompt": "hi",', 400),
    ("not an object", "/v1/completions", [1, 2], 400),
    ("missing prompt", "/v1/completions", {"max_tokens": 4}, 400),
    ("missing messages", "/v1/chat/completions", {"max_tokens": 4}, 400),
    ("prompt wrong type", "/v1/completions", {"prompt": 12}, 400),
    ("max_tokens wrong type", "/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400),
    ("temperature wrong type", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
    ("messages wrong type", "/v1/chat/completions", {"messages": "hi"}, 400),
    ("message without role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400),
    ("stream wrong type", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400),
    ("max_tokens < 1", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400),
    ("temperature < 0", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400),
    ("temperature huge", "/v1/completions", {"prompt": "hi", "temperature": 1e81}, 400),
    ("setting overflows", "/v1/completions", {"prompt": "hi", "s2d2": {"penalty": 1e300}}, 400),
    ("top_p = 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400),
    ("top_p > 1", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400),
    ("unknown model", "/v1/completions", {"model": "gpt-5", "prompt": "hi"}, 404),
    ("prompt longer than the context", "/v1/completions", {"prompt": TOO_LONG}, 400),
    ("text prompt longer than the context", "/v1/completions", {"prompt": "five " * 600}, 400),
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400),
    ("token id out of range", "/v1/completions", {"prompt": [5, 99999]}, 400),
    ("mask token in prompt", "/v1/completions", {"prompt": [5, 2, 6]}, 400),
    ("unknown decoder", "/v1/completions", {"prompt": "hi", "s2d2": {"decoder": "magic"}}, 400),
    ("unknown policy", "/v1/completions", {"prompt": "hi", "s2d2": {"policy": "sometimes"}}, 400),
    ("unknown preset", "/v1/completions", {"prompt": "hi", "s2d2": {"preset": "fastest"}}, 400),
    ("unknown setting", "/v1/completions", {"prompt": "hi", "s2d2": {"warp_speed": 9}}, 400),
    ("bad setting value", "/v1/completions", {"prompt": "hi", "s2d2": {"threshold": 2.0}}, 400),
    ("huge block size", "/v1/completions", {"prompt": "hi", "s2d2": {"block_size": 10**12}}, 400),
    ("huge plan block size", "/v1/completions", {"prompt": "hi", "s2d2": {"plan_block_sizes": [8, 10**6]}},
     400),
    ("zero plan block size", "/v1/completions", {"prompt": "hi", "s2d2": {"plan_block_sizes": [0]}}, 400),
    ("n = 0", "/v1/completions", {"prompt": "hi", "n": 0}, 400),
    ("best_of != n", "/v1/completions", {"prompt": "hi", "best_of": 2}, 400),
    ("too many choices", "/v1/completions", {"prompt": ["a"] * 9, "n": 8}, 400),
    ("five stop strings", "/v1/completions", {"prompt": "hi", "stop": list("abcde")}, 400),
    ("no user message", "/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}]}, 400),
    ("body over the size limit", "/v1/completions", {"prompt": "x " * 600_000}, 413),
    ("unknown route", "/v1/embeddings", {"input": "hi"}, 404),
]


@pytest.mark.parametrize("name,path,body,status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_is_a_4xx_with_openai_error(url, name, path, body, status):
    if isinstance(body, bytes):
        resp = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    else:
        resp = httpx.post(url + path, json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"]
    assert err["type"] == "invalid_request_error"
    assert httpx.get(url + "/health").json()["status"] == "ok"


def _assert_preset_refused(resp) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == "s2d2.preset"
    assert err["code"] == "invalid_value" and "\n" not in err["message"]
    assert "root:" not in resp.text  # nothing of the file leaks into the answer


def test_request_preset_may_not_name_a_server_file(url, tmp_path):
    """A request's ``s2d2.preset`` is a preset name only: never a file on the server, whether it exists,
    is not a preset file (/etc/passwd), or is a valid preset file."""
    valid = tmp_path / "valid.json"
    valid.write_text(json.dumps({"name": "p", "settings": {"decoder": "ar"}}))
    for preset in ("/etc/passwd", str(valid), "../../etc/passwd.json"):
        for path, body in (
            ("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        ):
            _assert_preset_refused(httpx.post(url + path, json={**body, "s2d2": {"preset": preset}}))
    # a named preset still works
    named = {"prompt": "hi", "max_tokens": 4, "s2d2": {"preset": "lossless"}}
    ok = httpx.post(url + "/v1/completions", json=named)
    assert ok.status_code == 200, ok.text
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_server_preset_may_be_a_file(model, tmp_path):
    """The operator's own ``--preset`` (create_app's ``preset``) may be a preset file."""
    path = tmp_path / "ar.json"
    path.write_text(json.dumps({"name": "ar-file", "settings": {"decoder": "ar"}}))
    with running_server(create_app(model, preset=str(path), max_num_seqs=4)) as base:
        body = {"prompt": QUESTIONS[0], "max_tokens": 24}
        served = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert served.status_code == 200, served.text
        alone = model.generate(QUESTIONS[0], decoder="ar", max_new_tokens=24).text
        assert served.json()["choices"][0]["text"] == alone


def test_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny-gsm", prompt="hi", n=0)
    assert exc.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")


# ---------------------------------------------------------------------------------------------- 429, SIGTERM
def test_full_queue_answers_429_with_retry_after():
    small = s2d2.load("tiny-gsm", max_num_seqs=1)
    with running_server(create_app(small, max_num_seqs=1, max_queue=1)) as base:
        body = {"prompt": QUESTIONS[5], "max_tokens": 400, "stream": True, "s2d2": LONG}
        with (
            httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as first,
            httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as second,
        ):
            assert first.status_code == 200 and second.status_code == 200  # one running, one waiting
            third = httpx.post(base + "/v1/completions", json={"prompt": "hi"})
            assert third.status_code == 429 and third.headers["Retry-After"] == "1"
            assert third.json()["error"]["type"] == "rate_limit_exceeded"
            assert requests_total(base, "rejected") == 1
        # both were aborted by their disconnect (the waiting one too): the queue has room for two again
        with (
            httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as first,
            httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as second,
        ):
            assert first.status_code == 200 and second.status_code == 200
        ok = httpx.post(base + "/v1/completions", json={"prompt": QUESTIONS[5]}, timeout=30)
        assert ok.status_code == 200


def start_server(
    port: int, *extra: str, max_num_seqs: int = 4, grace: int | None = 30, wait: float = 60.0
) -> subprocess.Popen:
    """``s2d2 serve`` on ``port`` in a subprocess with stdin closed, once its /health answers (at most
    ``wait`` seconds); ``grace``: its ``--grace`` (None: the default)."""
    cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--port", str(port)]
    cmd += ["--max-num-seqs", str(max_num_seqs)] + ([] if grace is None else ["--grace", str(grace)])
    cmd += ["--log-level", "warning", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + wait
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"s2d2 serve did not start: {proc.communicate()[0].decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)


def test_sigterm_finishes_running_requests_and_exits_0(tmp_path):
    port = free_port()
    proc = start_server(port)
    base = f"http://127.0.0.1:{port}"
    try:
        results: list = [None] * 3
        started = threading.Barrier(4, timeout=30)

        def stream(i: int) -> None:
            body = {
                "prompt": QUESTIONS[i],
                "max_tokens": 300,
                "stream": True,
                "s2d2": LONG,
                "stream_options": {"include_usage": True},
            }
            text, usage, first = "", None, True
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first:
                        started.wait()
                        first = False
                    data = json.loads(line[6:])
                    usage = data.get("usage") or usage
                    text += "".join(c["text"] for c in data["choices"])
            results[i] = (text, usage)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        started.wait()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    for text, usage in results:
        assert text and usage["completion_tokens"] == 300  # ran to the end, not cut by the shutdown


def test_routing_state_file_survives_a_restart(tmp_path):
    """``--routing-state``: engine-scoped UCB statistics are written at shutdown, read at the next start."""
    from s2d2.decoding.routing_state import EngineRoutingState

    state = tmp_path / "routing.json"
    body = {"max_tokens": 48, "s2d2": {"policy": "ucb", "ucb_scope": "engine", "block_size": 8}}

    def serve_once() -> int:
        port = free_port()
        proc = start_server(port, "--routing-state", str(state))
        try:
            verified = 0
            for q in QUESTIONS[:8]:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions", json={"prompt": q, **body}, timeout=60
                )
                assert r.status_code == 200, r.text
                verified += r.json()["s2d2"]["verify_steps"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
            return verified
        finally:
            if proc.poll() is None:
                proc.kill()

    verified = serve_once()
    first = EngineRoutingState.read(state)
    (settings,) = [dict(k) for k in first.tables]
    assert settings["ucb_scope"] == "engine" and settings["block_size"] == 8
    assert first.total_pulls() >= verified > 0
    serve_once()  # starts from the file: the second run's pulls add to the first's
    second = EngineRoutingState.read(state)
    assert second.total_pulls() > first.total_pulls()
    # a file that is not a routing state stops the server at start with one line, and is left alone
    state.write_text('{"format": "something-else"}', encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--port", str(port), "--routing-state", str(state)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "not an s2d2 routing-state file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert state.read_text(encoding="utf-8") == '{"format": "something-else"}'

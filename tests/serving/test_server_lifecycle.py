"""The server's lifecycle as the docs describe it (issue 52): the routing-state file is checked by writing
beside it at start and a truncated one is logged; while draining after a stop signal new requests get a
503 with ``Retry-After``; ``/docs`` loads nothing from outside the server; ``/docs`` and
``/openapi.json`` need the API key when one is set."""

from __future__ import annotations

import copy
import json
import logging
import re
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from test_server import free_port, running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.decoding.routing_state import EngineRoutingState  # noqa: E402
from s2d2.errors import S2D2Error  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.serving.server import make_server  # noqa: E402

Q = "Tom has 3 apples. He buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=2)


# ---------------------------------------------------------------------------------------------- routing state
def test_a_routing_state_path_no_file_can_be_created_in_is_an_error_at_start(model, tmp_path):
    """``/proc`` passes ``os.access(W_OK)`` as root, yet no file can be created there."""
    with pytest.raises(S2D2Error, match="cannot be written back"):
        create_app(model, routing_state="/proc/s2d2-routing-state.json")
    ok = tmp_path / "state.json"
    create_app(model, routing_state=ok)
    assert list(tmp_path.iterdir()) == []  # the write check leaves nothing behind


def test_a_state_file_over_max_routing_tables_is_logged(model, tmp_path, caplog):
    state = EngineRoutingState(max_tables=8)
    for i in range(5):
        state.table(s2d2.DecodeConfig.build(policy="ucb", ucb_scope="engine", threshold=0.5 + i / 10))
    path = tmp_path / "state.json"
    state.write(path)
    with caplog.at_level(logging.WARNING, logger="s2d2.serving"):
        app = create_app(model, routing_state=path, max_routing_tables=2)
    assert len(app.state.s2d2.engine.engine.routing.tables) == 2
    (record,) = [r for r in caplog.records if "--routing-state" in r.getMessage()]
    message = record.getMessage()
    assert "5 tables" in message and "--max-routing-tables 2" in message and "kept the 2" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="s2d2.serving"):
        create_app(model, routing_state=path, max_routing_tables=5)  # fits: nothing to say
    assert not [r for r in caplog.records if "--routing-state" in r.getMessage()]


# ---------------------------------------------------------------------------------------------- draining
class Gated:
    """The model's adapter, its forwards held while ``hold`` is set (a request that cannot finish)."""

    def __init__(self, adapter):
        self.inner = adapter
        self.hold = threading.Event()
        self.held = threading.Event()  # a forward is being held
        self.released = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, segments):
        if self.hold.is_set():
            self.held.set()
            self.released.wait(60)
        return self.inner.run(segments)


def test_while_draining_new_requests_get_503_with_retry_after_and_running_ones_finish(model):
    gated = Gated(model.adapter)
    held = copy.copy(model)
    held.adapter, held._engine = gated, None
    app = create_app(held, max_num_seqs=2)
    port = free_port()
    server = make_server(app, host="127.0.0.1", port=port, grace=30, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    events: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        gated.hold.set()
        body = {"prompt": Q, "max_tokens": 12, "stream": True, "s2d2": {"decoder": "ar", "ignore_eos": True}}

        def stream() -> None:
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as resp:
                events.extend(line[6:] for line in resp.iter_lines() if line.startswith("data: "))

        running = threading.Thread(target=stream)
        running.start()
        assert gated.held.wait(30), "the request did not reach the engine"
        server.handle_exit(signal.SIGTERM, None)  # what the signal handler calls
        time.sleep(0.5)  # several ticks of uvicorn's main loop: a server that stops listening has by now
        with httpx.Client(timeout=10) as fresh:  # a new connection
            for method, path, payload in [
                ("POST", "/v1/completions", {"prompt": Q, "max_tokens": 4}),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": Q}]}),
                ("GET", "/v1/models", None),
            ]:
                resp = fresh.request(method, base + path, json=payload)
                assert resp.status_code == 503, (path, resp.text)
                assert resp.headers["Retry-After"] == "1" and resp.headers["Connection"] == "close"
                err = resp.json()["error"]
                assert err["code"] == "draining" and err["type"] == "server_error", err
            assert fresh.get(base + "/health").status_code == 503
            assert fresh.get(base + "/metrics").status_code == 200
        assert thread.is_alive()  # still serving: the running request is not done
        gated.released.set()
        running.join(30)
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop once its request was done"
    finally:
        gated.released.set()
        server.should_exit = True
        thread.join(30)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and not any("error" in c for c in chunks)
    assert sum(len(c["choices"][0]["text"]) > 0 for c in chunks if c["choices"]) > 0
    with pytest.raises(httpx.TransportError):  # gone now: it stopped listening
        httpx.get(base + "/health", timeout=2)


# ---------------------------------------------------------------------------------------------- docs
def test_docs_load_nothing_from_outside_the_server(model):
    with running_server(create_app(model, max_num_seqs=2)) as base:
        page = httpx.get(base + "/docs", timeout=10)
        assert page.status_code == 200 and "swagger-ui" in page.text
        urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert urls and all(u.startswith("/") for u in urls), urls  # nothing absolute: no CDN
        assert "http://" not in page.text and "https://" not in page.text
        for u in urls:
            asset = httpx.get(base + u, timeout=10)
            assert asset.status_code == 200 and len(asset.content) > 0, u
        js = httpx.get(base + "/docs/assets/swagger-ui-bundle.js", timeout=10).text
        assert "SwaggerUIBundle" in js
        assert httpx.get(base + "/openapi.json", timeout=10).json()["info"]["title"]
        assert httpx.get(base + "/redoc", timeout=10).status_code == 404  # FastAPI's (a CDN page): off


def test_docs_and_openapi_need_the_api_key(model):
    with running_server(create_app(model, max_num_seqs=2, api_key="sekret")) as base:
        key = {"Authorization": "Bearer sekret"}
        for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui.css"):
            denied = httpx.get(base + path, timeout=10)
            assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key", path
            assert httpx.get(base + path, headers=key, timeout=10).status_code == 200, path
        assert httpx.get(base + "/health", timeout=10).status_code == 200  # probes stay open


def test_the_docs_page_is_our_own_file_set():
    """Every asset the page names exists in the installed package (what /docs/assets serves)."""
    from s2d2.serving.docs_ui import ASSETS_PATH, docs_page, swagger_ui_files

    folder = swagger_ui_files()
    assert folder is not None, "swagger-ui-bundle (the serve extra) is not installed"
    names = re.findall(re.escape(ASSETS_PATH) + r'/([^"]+)"', docs_page("t"))
    assert names and all(Path(folder, n).is_file() for n in names)

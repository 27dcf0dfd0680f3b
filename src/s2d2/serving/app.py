"""The FastAPI app: OpenAI-compatible endpoints on one batched engine (``create_app(model, ...)``).

``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not), ``GET /v1/models``,
``GET /health`` and ``GET /metrics``. The app owns an :class:`EngineThread` (started and stopped by the
app's lifespan); each request is checked (:mod:`.prepare`), submitted, and answered from its own queue
(:mod:`.responses`). See ``docs`` of :mod:`s2d2.serving` for the behaviour under load and faults.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..decoding.routing_state import EngineRoutingState
from ..engine.llm_engine import LLMEngine
from ..errors import S2D2Error
from .detokenizer import TextStream
from .engine_thread import Draining, EngineThread, QueueFull
from .errors import APIError, bad_request, install_error_handlers
from .limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from .metrics import ServerMetrics
from .prepare import Prepared, prepare
from .protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)
from .responses import collect, completion_body, sse_chunks, text_events

#: Seconds a client is told to wait after a 429.
RETRY_AFTER_S = 1
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 429, 500, 503)
}


class ServerState:
    """What the endpoints share: the model, its engine thread, metrics and the serving options."""

    def __init__(self, model: Any, engine: EngineThread, *, name: str, preset: str | None):
        self.model = model
        self.engine = engine
        self.metrics = engine.metrics
        self.name = name
        self.preset = preset
        self.created = int(time.time())
        #: which server process answered (tells replicas apart behind a load balancer)
        self.replica = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _check_preset(model: Any, preset: str | None) -> None:
    if preset is not None:
        model.make_config(preset=preset)  # a ConfigError (one line) for an unknown preset


def _open_routing_state(engine: LLMEngine, path: str | os.PathLike[str] | None) -> Path | None:
    """Start ``engine``'s shared routing statistics from ``path`` (if the file exists); a one-line error
    now, not at shutdown, if it is unreadable or its directory cannot take the file back."""
    if path is None:
        return None
    path = Path(path)
    if path.exists():
        engine.routing = EngineRoutingState.read(path)
    parent = path.resolve().parent
    if path.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise S2D2Error(
            f"--routing-state {path}: cannot be written back ({parent} is not a writable directory)"
        )
    return path


def _save_routing_state(engine: LLMEngine, path: Path) -> None:
    """Write the statistics back at shutdown; a failure is reported in one line (the exit stays clean)."""
    try:
        engine.routing.write(path)
    except S2D2Error as exc:
        print(f"error: {exc}", file=sys.stderr)


def create_app(
    model: Any,
    *,
    preset: str | None = None,
    max_num_seqs: int | None = None,
    max_queue: int = 64,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    served_name: str | None = None,
    routing_state: str | os.PathLike[str] | None = None,
) -> FastAPI:
    """An app serving ``model`` (an :class:`s2d2.S2D2Model`) with its own streaming engine.

    ``preset``: the server's default decoding preset; ``max_num_seqs``: rows decoding together (default:
    the model's); ``max_queue``: requests that may wait for a row before new ones get 429;
    ``max_body_bytes``: the request body limit (413 above it); ``served_name``: the model id clients use
    (default: the model's name); ``routing_state``: a routing-state file (``ucb_scope=engine`` statistics,
    :mod:`s2d2.decoding.routing_state`): the engine starts from it if it exists and writes it back at
    shutdown.
    """
    _check_preset(model, preset)
    rows = max_num_seqs or model.max_num_seqs
    engine = LLMEngine(model.adapter, max_num_seqs=rows, kv_budget_tokens=model.kv_budget_tokens, stream=True)
    state_file = _open_routing_state(engine, routing_state)
    thread = EngineThread(engine, max_queue=max_queue, metrics=ServerMetrics(rows))
    state = ServerState(model, thread, name=served_name or model.name, preset=preset)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thread.start()
        yield
        thread.stop()
        if state_file is not None:
            _save_routing_state(engine, state_file)

    app = FastAPI(
        title="s2d2 OpenAI-compatible server",
        version="0.1.0",
        description="Block-diffusion decoding with S2D2, per-request decoding settings in the `s2d2` object.",
        lifespan=lifespan,
    )
    app.state.s2d2 = state
    install_error_handlers(app, state.metrics)
    _routes(app, state)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app


def _routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses=ERROR_RESPONSES)
    async def health() -> JSONResponse:
        state.engine.ensure_started()
        if state.engine.draining or not state.engine.alive:
            raise APIError(503, "the server is shutting down", code="draining")
        return JSONResponse({"status": "ok", "replica": state.replica})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": state.name, "object": "model", "created": state.created, "owned_by": "s2d2"}],
        }

    @app.post("/v1/completions", response_model=CompletionResponse, responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await _serve(state, body, request, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await _serve(state, body, request, chat=True)


async def _submit(state: ServerState, prep: Prepared) -> Any:
    state.engine.ensure_started()  # where the host runs no lifespan events
    try:
        sub = state.engine.submit(prep.prompt_ids, prep.config)
    except QueueFull as exc:
        raise APIError(
            429, str(exc), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    except Draining as exc:
        raise APIError(503, str(exc), code="draining") from None
    try:
        await sub.accepted
    except S2D2Error as exc:
        raise bad_request(str(exc), param="prompt", code="invalid_prompt") from None
    return sub


async def _serve(state: ServerState, body: Any, request: Request, *, chat: bool) -> Any:
    prep = prepare(state.model, body, served_name=state.name, server_preset=state.preset)
    sub = await _submit(state, prep)
    text = TextStream(state.model.decode_ids, prep.stop)
    events = text_events(state.engine, sub, text)
    if prep.stream:
        chunks = sse_chunks(events, chat=chat, model=state.name, include_usage=prep.include_usage)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    full, outcome = await collect(events, request.is_disconnected)
    return JSONResponse(completion_body(full, outcome, chat=chat, model=state.name))

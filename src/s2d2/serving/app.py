"""The FastAPI app: OpenAI-compatible endpoints on one batched engine (``create_app(model, ...)``).

``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses``
(:mod:`.openai_responses`; streamed or not), Anthropic's ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (:mod:`.anthropic_messages`), ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``GET /openapi.json`` and ``GET /docs`` (:mod:`.docs_ui`). The app
owns an :class:`EngineThread` (started and stopped by the app's lifespan); each request is checked
(:mod:`.prepare`), submitted, and answered from its own queue (:mod:`.responses`). See ``docs`` of
:mod:`s2d2.serving` for the behaviour under load and faults.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ..decoding.routing_state import DEFAULT_MAX_TABLES, EngineRoutingState
from ..engine.llm_engine import LLMEngine
from ..errors import S2D2Error
from .anthropic_messages.errors import AnthropicErrors
from .anthropic_messages.request import CountTokensRequest, MessagesRequest
from .anthropic_messages.serve import count_tokens, serve_message
from .detokenizer import TextStream
from .docs_ui import add_docs
from .drain import DrainGate, draining_error
from .engine_thread import Draining, EngineThread, QueueFull
from .errors import CLIENT_CLOSED, APIError, bad_request, install_error_handlers
from .limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from .metrics import ServerMetrics
from .openai_responses.request import ResponsesRequest
from .openai_responses.serve import serve_response
from .prepare import Prepared, check_model_name, prepare
from .prompt_scoring import prompt_scores, prompt_top
from .protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from .reasoning.detect import detect_reasoning_parser
from .reasoning.parser import PARSERS
from .request_checks import check_body_text
from .responses import (
    Delta,
    Renderer,
    collect_all,
    completion_body,
    event_stream,
    score_only_events,
    sse_chunks,
    text_events,
)
from .security import AccessControl
from .served_model import ServedModel
from .tools.formats import format_named
from .tools.reply import new_reader, reply_events
from .translated import ChatSteps

log = logging.getLogger("s2d2.serving")

#: Seconds a client is told to wait after a 429 (and a 503 while the server drains).
RETRY_AFTER_S = 1
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 429, 500, 503)
}


class ServerState:
    """What the endpoints share: the model, its engine thread, metrics and the serving options."""

    def __init__(self, model: ServedModel, engine: EngineThread, *, name: str, preset: str | None):
        self.model = model
        self.engine = engine
        self.metrics = engine.metrics
        self.name = name
        self.preset = preset
        self.created = int(time.time())
        #: which server process answered (tells replicas apart behind a load balancer)
        self.replica = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        #: the routing-state file written back at shutdown, and whether that (or the shutdown) failed
        self.routing_file: Path | None = None
        self.shutdown_failed = False
        #: ``--tool-call-parser`` (None: detected from the chat template)
        self.tool_parser: str | None = None
        #: the reasoning parser in force (``--reasoning-parser``, else detected; None: none)
        self.reasoning_parser: str | None = None

    def card(self) -> dict[str, Any]:
        """The served model's ``/v1/models`` entry: vLLM's ``max_model_len`` (prompt and output together);
        ``generation_defaults``, the sampling defaults of a request that omits them (the checkpoint's
        ``generation_config.json``, unless turned off); under ``s2d2``, a request's default block size."""
        defaults = dict(self.model.info.generation_defaults)
        block = self.model.make_config(preset=self.preset).block_size
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "s2d2",
                "max_model_len": self.model.info.max_length, "generation_defaults": defaults,
                "s2d2": {"block_size": block}}  # fmt: skip

    def write_routing_state(self) -> bool:
        """Write the engine's routing statistics to :attr:`routing_file` (if any); False if that failed
        (said in one line on stderr; :attr:`shutdown_failed` is set)."""
        if self.routing_file is None:
            return True
        ok = _save_routing_state(self.engine.engine, self.routing_file)
        self.shutdown_failed = self.shutdown_failed or not ok
        return ok


def _check_preset(model: ServedModel, preset: str | None) -> None:
    if preset is not None:
        model.make_config(preset=preset)  # a ConfigError (one line) for an unknown preset


def _open_routing_state(
    engine: LLMEngine, path: str | os.PathLike[str] | None, max_tables: int = DEFAULT_MAX_TABLES
) -> Path | None:
    """Start ``engine``'s shared routing statistics from ``path`` (if the file exists; at most
    ``max_tables`` tables); a one-line error now, not at shutdown, if it is unreadable or its directory
    cannot take the file back."""
    engine.routing.set_max_tables(max_tables)
    if path is None:
        return None
    path = Path(path)
    if path.exists():
        detokenize = engine.routing.detokenize
        engine.routing = EngineRoutingState.read(path, max_tables)
        engine.routing.detokenize = detokenize  # the syntax policy's static checks keep the tokenizer
        if engine.routing.evictions:
            log.warning(
                "--routing-state %s: it holds %d tables, more than --max-routing-tables %d; kept the %d most "
                "recently used (the others are dropped, and gone from the file at shutdown)",
                path,
                engine.routing.evictions + len(engine.routing.tables),
                max_tables,
                len(engine.routing.tables),
            )
    parent = path.resolve().parent
    if path.is_dir() or not parent.is_dir() or not _can_write_in(parent):
        raise S2D2Error(
            f"--routing-state {path}: cannot be written back ({parent} is not a writable directory)"
        )
    return path


def _can_write_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: tried by writing (and removing) a temporary file there
    (``os.access`` says yes for paths no file can be created in, such as ``/proc`` as root)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".s2d2-write-check-", delete=True) as probe:
            probe.write(b"{}")
            probe.flush()
    except OSError:
        return False
    return True


def _save_routing_state(engine: LLMEngine, path: Path) -> bool:
    """Write the statistics back; a failure is reported in one line and returns False."""
    for _ in range(3):  # a snapshot taken while the engine thread still learns may change under it
        try:
            engine.routing.write(path)
            return True
        except S2D2Error as exc:
            print(f"error: {exc}", file=sys.stderr)
            return False
        except RuntimeError:
            continue
    print(f"error: --routing-state {path}: the statistics kept changing while being written", file=sys.stderr)
    return False


def create_app(
    model: ServedModel,
    *,
    preset: str | None = None,
    max_num_seqs: int | None = None,
    max_queue: int = 64,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    served_name: str | None = None,
    routing_state: str | os.PathLike[str] | None = None,
    max_query_tokens_per_row: int | None = None,
    max_routing_tables: int = DEFAULT_MAX_TABLES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
    api_key: str | None = None,
    allowed_hosts: list[str] | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> FastAPI:
    """An app serving ``model`` (an :class:`s2d2.S2D2Model`) with its own streaming engine.

    ``preset``: the server's default decoding preset; ``max_num_seqs``: rows decoding together (default:
    the model's); ``max_queue``: requests that may wait for a row before new ones get 429;
    ``max_body_bytes``: the request body limit (413 above it); ``served_name``: the model id clients use
    (default: the model's name); ``routing_state``: a routing-state file (``ucb_scope=engine`` statistics,
    :mod:`s2d2.decoding.routing_state`): the engine starts from it if it exists and writes it back at
    shutdown. Robustness (docs of :mod:`s2d2.serving`): ``max_query_tokens_per_row`` (default: the
    model's, else the engine's default), ``max_routing_tables`` (engine-scope routing tables kept),
    ``body_timeout`` (seconds a body may take, 408 after), ``api_key`` (required as a Bearer token on
    every ``/v1`` route, ``/docs`` and ``/openapi.json``) and ``allowed_hosts`` (``Host`` header names;
    default: the loopback names). ``tool_call_parser``: the tool-call format (:mod:`.tools.formats`;
    default: detected from the chat template). ``reasoning_parser``: ``qwen3`` (``<think>`` blocks read
    into ``reasoning_content``), ``none``, or None: detected from the chat template
    (:func:`.reasoning.detect.detect_reasoning_parser`).
    """
    _check_preset(model, preset)
    if tool_call_parser is not None:
        format_named(tool_call_parser)  # a one-line error now for an unknown name
    reasoning = resolve_reasoning_parser(model, reasoning_parser)
    rows = max_num_seqs or model.max_num_seqs
    limit = max_query_tokens_per_row or getattr(model, "max_query_tokens_per_row", None)
    engine = LLMEngine(
        model.adapter,
        max_num_seqs=rows,
        kv_budget_tokens=model.kv_budget_tokens,
        stream=True,
        max_query_tokens_per_row=limit,
        cost=model.cost,
        prefix_cache=model.prefix_cache,
        kv_page_size=model.kv_page_size,
        capture_graphs=True,
    )
    if preset is not None:  # the server's default must fit its own engine: say so now, not per request
        engine.check_limits(model.make_config(preset=preset))
    state_file = _open_routing_state(engine, routing_state, max_routing_tables)
    thread = EngineThread(engine, max_queue=max_queue, metrics=ServerMetrics(rows))
    state = ServerState(model, thread, name=served_name or model.name, preset=preset)
    state.routing_file = state_file
    state.tool_parser = tool_call_parser
    state.reasoning_parser = reasoning

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thread.start()
        yield
        thread.stop()
        state.write_routing_state()

    app = FastAPI(
        title="s2d2 OpenAI-compatible server",
        version="0.1.0",
        description="Block-diffusion decoding with S2D2, per-request decoding settings in the `s2d2` object.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load Swagger UI / ReDoc from a CDN: ours serves its own (docs_ui)
        redoc_url=None,
    )
    app.state.s2d2 = state
    install_error_handlers(app, state.metrics)
    _routes(app, state)
    add_docs(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, timeout=body_timeout)
    app.add_middleware(DrainGate, draining=lambda: thread.draining, retry_after=RETRY_AFTER_S)
    app.add_middleware(AccessControl, allowed_hosts=allowed_hosts, api_key=api_key)  # first check
    app.add_middleware(AnthropicErrors)  # outermost: Anthropic's error shape on /v1/messages
    return app


def resolve_reasoning_parser(model: ServedModel, name: str | None) -> str | None:
    """The reasoning parser in force: ``name`` (``none``: no parser), else the chat template's
    (:func:`.reasoning.detect.detect_reasoning_parser`); an unknown name is a one-line S2D2Error."""
    if name is None:
        return detect_reasoning_parser(getattr(model.tokenizer, "chat_template", None))
    if name == "none":
        return None
    if name not in PARSERS:
        names = ", ".join(sorted(PARSERS))
        raise S2D2Error(f"unknown reasoning parser {name!r}; choose one of: none, {names}")
    return name


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
            "data": [state.card()],
        }

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model_card(model_id: str) -> dict[str, Any]:
        check_model_name(model_id, state.name)
        return state.card()

    @app.post("/v1/completions", response_model=CompletionResponse, responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await _serve(state, body, request, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await _serve(state, body, request, chat=True)

    @app.post("/v1/responses", responses=ERROR_RESPONSES)
    async def responses(body: ResponsesRequest, request: Request) -> Any:
        return await serve_response(state, body, request, _STEPS)

    @app.post("/v1/messages", responses=ERROR_RESPONSES)
    async def messages(body: MessagesRequest, request: Request) -> Any:
        return await serve_message(state, body, request, _STEPS)

    @app.post("/v1/messages/count_tokens", responses=ERROR_RESPONSES)
    async def messages_count_tokens(body: CountTokensRequest) -> Any:
        return await count_tokens(state, body, _STEPS)


async def _submit(state: ServerState, prep: Prepared) -> list[Any]:
    """One engine request per choice, all or none (a refusal aborts the choices already queued)."""
    state.engine.ensure_started()  # where the host runs no lifespan events
    subs: list[Any] = []
    try:
        for row in prep.rows:
            subs.append(state.engine.submit(row.prompt_ids, row.config, prep.constraint))
    except (QueueFull, Draining) as exc:
        for sub in subs:
            state.engine.abort(sub.request_id)
        if isinstance(exc, Draining):
            raise draining_error(RETRY_AFTER_S) from None
        raise APIError(
            429, str(exc), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    taken = await asyncio.gather(*(sub.accepted for sub in subs), return_exceptions=True)
    failed = [exc for exc in taken if isinstance(exc, BaseException)]
    if failed:
        for sub in subs:
            state.engine.abort(sub.request_id)
        if isinstance(failed[0], S2D2Error):
            raise bad_request(str(failed[0]), param="prompt", code="invalid_prompt") from None
        raise failed[0]
    return subs


def _prepare(state: ServerState, body: Any) -> Prepared:
    """The request's text checks (:mod:`.request_checks`), then :func:`.prepare.prepare` (tokenising):
    run in a worker thread, so a long prompt never holds the event loop."""
    check_body_text(body, state.model.info.max_length)
    return prepare(
        state.model,
        body,
        served_name=state.name,
        server_preset=state.preset,
        tool_parser=state.tool_parser,
        reasoning_parser=state.reasoning_parser,
    )


_STEPS = ChatSteps(_prepare, _submit)


async def _serve(state: ServerState, body: Any, request: Request, *, chat: bool) -> Any:
    prep = await asyncio.to_thread(_prepare, state, body)
    decode = state.model.decode_ids
    if not prep.skip_special:  # EOS renders alike at every position of an output that ignores it
        keep = any(row.config.ignore_eos for row in prep.rows)
        decode = functools.partial(state.model.decode_ids, skip_special_tokens=False, drop_stop=not keep)
    k = prompt_top(prep)
    scores = None if k is None else await asyncio.to_thread(prompt_scores, state.model, prep.prompts, k)
    if prep.score_only:
        streams = [score_only_events(row) for row in prep.rows]
    else:
        subs = await _submit(state, prep)
        want = prep.logprobs is not None
        keep = prep.include_stop
        streams = [
            text_events(state.engine, sub, TextStream(decode, prep.stop, include_stop=keep), logprobs=want)
            for sub in subs
        ]
    r = Renderer(prep, chat, state.name, decode, scores)
    if prep.stream and new_reader(prep.tools, prep.reasoning) is not None:
        make = functools.partial(new_reader, prep.tools, prep.reasoning)
        streams = [reply_events(s, make, Delta) for s in streams]
    if prep.stream:
        return event_stream(sse_chunks(r, streams))
    results = await collect_all(streams, request.is_disconnected)
    if results is None:  # the client went away: its choices are aborted, nobody reads an answer
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(completion_body(r, results))

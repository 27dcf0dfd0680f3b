"""Answering ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the request as a chat request
(:mod:`.request`), decoded by the same engine path as chat completions, answered as a message or its
events (:mod:`.reply`).

One reply per request. An error the chat checks raise names the Messages field where the two differ
(``stop_sequences``, ``tools.N.input_schema``, ``output_config.format``, ``messages``). ``count_tokens``
answers ``{"input_tokens": N}``, N the prompt's token count exactly as ``/v1/messages`` renders it
(chat template, tools unless ``tool_choice`` is none).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..detokenizer import TextStream
from ..errors import APIError, decode_error
from ..responses import collect_all, text_events
from ..tools.parser import Content
from ..tools.reply import new_reader, reply_message
from .reply import MessageHead, content_blocks, message_events, stop_reason, tool_use_id, usage_of
from .request import CountTokensRequest, MessagesRequest, to_chat

#: Chat field -> Messages field, for error messages' ``param``.
_PARAMS = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
CLIENT_CLOSED = 499


def _renamed(exc: APIError) -> APIError:
    p = exc.param
    if p is not None:
        p = _PARAMS.get(p, p)
        p = re.sub(r"^tools\.(\d+)\.function\.parameters", r"tools.\1.input_schema", p)
        p = re.sub(r"^tools\.(\d+)\.function", r"tools.\1", p)
        p = re.sub(r"^messages\.\d+.*", "messages", p)
    exc.param = p
    return exc


async def _prepared(state: Any, body: Any, prepare: Callable[[Any, Any], Any]) -> Any:
    try:
        return await asyncio.to_thread(lambda: prepare(state, to_chat(body)))
    except APIError as exc:
        raise _renamed(exc) from None


def matched_stop(stream: TextStream, decode: Callable[[list[int]], str], stops: list[str]) -> str | None:
    """The stop sequence that ended ``stream``'s text (the first in the text), None if none did."""
    if not stream.stopped:
        return None
    full = decode(stream.ids[: stream.n_tokens])
    hits = [(full.find(s), -len(s), s) for s in stops if s and s in full]
    return min(hits)[2] if hits else None


async def serve_message(
    state: Any,
    body: MessagesRequest,
    request: Request,
    *,
    prepare: Callable[[Any, Any], Any],
    submit: Callable[[Any, Any], Awaitable[list[Any]]],
) -> Response:
    """The message (see the module docstring); ``prepare`` / ``submit``: the app's own steps."""
    prep = await _prepared(state, body, prepare)
    sub = (await submit(state, prep))[0]
    decode = state.model.decode_ids
    stream = TextStream(decode, prep.stop)
    events = text_events(state.engine, sub, stream)
    head = MessageHead(state.name)
    reader = new_reader(prep.tools, prep.reasoning)
    prompt_tokens = len(prep.prompt_ids)

    def stop_of() -> str | None:
        return matched_stop(stream, decode, prep.stop)

    if prep.stream:

        def read(text: str, final: bool) -> list[Any]:
            if reader is None:
                return [Content(text)]
            return reader.feed(text) + (reader.finish() if final else [])

        def cut() -> bool:
            return reader is not None and reader.cut

        sse = message_events(head, events, read, prompt_tokens, stop_of, cut)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(sse, media_type="text/event-stream", headers=headers)
    results = await collect_all([events], request.is_disconnected)
    if results is None:
        return Response(status_code=CLIENT_CLOSED)
    res = results[0]
    if res.outcome.error is not None:
        raise decode_error(res.outcome.error, res.outcome.cannot_end)
    content, calls, thought, was_cut = res.text, [], None, False
    if reader is not None:
        message, was_cut = reply_message(reader, res.text)
        content, calls = message["content"], message.get("tool_calls", [])
        thought = message.get("reasoning_content")
    for call in calls:
        call["id"] = tool_use_id()
    stop = stop_of()
    reason = stop_reason(res.outcome.finish_reason, bool(calls), stop, was_cut)
    blocks = content_blocks(thought, content, calls)
    return JSONResponse(head.message(blocks, reason, stop, usage_of(prompt_tokens, res.outcome)))


async def count_tokens(
    state: Any, body: CountTokensRequest, *, prepare: Callable[[Any, Any], Any]
) -> JSONResponse:
    """``{"input_tokens": N}`` (see the module docstring)."""
    prep = await _prepared(state, body, prepare)
    return JSONResponse({"input_tokens": len(prep.prompt_ids)})

"""Answering ``POST /v1/responses``: the request as a chat request (:mod:`.request`), decoded by the same
engine path as chat completions, answered as a response object or its events (:mod:`.reply`).

One reply per request (the Responses API has no ``n``). An error the chat checks raise names the
Responses field where the two differ (``max_output_tokens``, ``text.format``, ``input``,
``tools[i].name``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..detokenizer import TextStream
from ..errors import APIError
from ..responses import collect_all, text_events
from ..tools.parser import Content
from ..tools.reply import new_reader, reply_message
from .reply import ResponseHead, output_items, response_events, status_of, usage_of
from .request import ResponsesRequest, to_chat

#: Chat field -> Responses field, for error messages' ``param``.
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}
CLIENT_CLOSED = 499


def _renamed(exc: APIError) -> APIError:
    p = exc.param
    if p is not None:
        p = re.sub(r"^tools\.(\d+)\.function", r"tools.\1", _PARAMS.get(p, p))
        p = re.sub(r"^messages\.\d+", "input", p)
    exc.param = p
    return exc


async def serve_response(
    state: Any,
    body: ResponsesRequest,
    request: Request,
    *,
    prepare: Callable[[Any, Any], Any],
    submit: Callable[[Any, Any], Awaitable[list[Any]]],
) -> Response:
    """The response (see the module docstring); ``prepare`` / ``submit``: the app's own steps."""
    try:
        prep = await asyncio.to_thread(lambda: prepare(state, to_chat(body)))
    except APIError as exc:
        raise _renamed(exc) from None
    sub = (await submit(state, prep))[0]
    events = text_events(state.engine, sub, TextStream(state.model.decode_ids, prep.stop))
    head = ResponseHead(state.name, body)
    reader = new_reader(prep.tools, prep.reasoning)
    prompt_tokens = len(prep.prompt_ids)
    if prep.stream:

        def read(text: str, final: bool) -> list[Any]:
            if reader is None:
                return [Content(text)]
            return reader.feed(text) + (reader.finish() if final else [])

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        stream = response_events(head, events, read, prompt_tokens, lambda: reader is not None and reader.cut)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    results = await collect_all([events], request.is_disconnected)
    if results is None:
        return Response(status_code=CLIENT_CLOSED)
    res = results[0]
    if res.outcome.error is not None:
        raise APIError(500, f"the request failed while decoding: {res.outcome.error}", code="decode_failed")
    content, calls, thought, cut = res.text, [], None, False
    if reader is not None:
        message, cut = reply_message(reader, res.text)
        content, calls = message["content"], message.get("tool_calls", [])
        thought = message.get("reasoning_content")
    status = "incomplete" if cut else status_of(res.outcome.finish_reason)
    output = output_items(content, calls, thought)
    return JSONResponse(head.response(status, output, usage_of(prompt_tokens, res.outcome)))

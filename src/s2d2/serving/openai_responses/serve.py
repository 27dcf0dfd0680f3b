"""Answering ``POST /v1/responses``: the request as a chat request (:mod:`.request`), decoded by the same
engine path as chat completions, answered as a response object or its events (:mod:`.reply`).

One reply per request (the Responses API has no ``n``). An error the chat checks raise names the
Responses field where the two differ (``max_output_tokens``, ``text.format``, ``input``,
``tools[i].name``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..errors import CLIENT_CLOSED, APIError
from ..responses import event_stream
from ..translated import ChatSteps, FieldNames, submitted
from .reply import ResponseHead, output_items, response_events, status_of, usage_of
from .request import ResponsesRequest, to_chat

#: How the Responses API names the chat request's fields, for error messages' ``param``.
NAMES = FieldNames(
    {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"},
    ((r"^tools\.(\d+)\.function", r"tools.\1"), (r"^messages\.\d+", "input")),
)


async def serve_response(state: Any, body: ResponsesRequest, request: Request, steps: ChatSteps) -> Response:
    """The response (see the module docstring); ``steps``: the app's own."""
    choice = await submitted(state, lambda: to_chat(body), NAMES, steps)
    head, reply = ResponseHead(state.name, body), choice.reply
    if choice.prep.stream:
        return event_stream(response_events(head, choice.events, reply.read, choice.prompt_tokens, reply.cut))
    res = await choice.collected(request)
    if res is None:
        return Response(status_code=CLIENT_CLOSED)
    if res.outcome.error is not None:
        raise APIError(500, f"the request failed while decoding: {res.outcome.error}", code="decode_failed")
    whole = reply.whole(res.text)
    status = "incomplete" if whole.cut else status_of(res.outcome.finish_reason)
    output = output_items(whole.content, whole.calls, whole.thought)
    return JSONResponse(head.response(status, output, usage_of(choice.prompt_tokens, res.outcome)))

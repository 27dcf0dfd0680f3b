"""Answering ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the request as a chat request
(:mod:`.request`), decoded by the same engine path as chat completions, answered as a message or its
events (:mod:`.reply`).

One reply per request. An error the chat checks raise names the Messages field where the two differ
(``stop_sequences``, ``tools.N.input_schema``, ``output_config.format``, ``messages``). ``count_tokens``
answers ``{"input_tokens": N}``, N the prompt's token count exactly as ``/v1/messages`` renders it
(chat template, tools unless ``tool_choice`` is none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..detokenizer import TextStream
from ..errors import CLIENT_CLOSED, decode_error
from ..responses import event_stream
from ..translated import ChatSteps, FieldNames, prepared, submitted
from .reply import MessageHead, content_blocks, message_events, stop_reason, tool_use_id, usage_of
from .request import CountTokensRequest, MessagesRequest, to_chat

#: How the Messages API names the chat request's fields, for error messages' ``param``.
NAMES = FieldNames(
    {
        "stop": "stop_sequences",
        "response_format": "output_config.format",
        "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    },
    (
        (r"^tools\.(\d+)\.function\.parameters", r"tools.\1.input_schema"),
        (r"^tools\.(\d+)\.function", r"tools.\1"),
        (r"^messages\.\d+.*", "messages"),
    ),
)


def matched_stop(stream: TextStream, decode: Callable[[list[int]], str], stops: list[str]) -> str | None:
    """The stop sequence that ended ``stream``'s text (the first in the text), None if none did."""
    if not stream.stopped:
        return None
    full = decode(stream.ids[: stream.n_tokens])
    hits = [(full.find(s), -len(s), s) for s in stops if s and s in full]
    return min(hits)[2] if hits else None


async def serve_message(state: Any, body: MessagesRequest, request: Request, steps: ChatSteps) -> Response:
    """The message (see the module docstring); ``steps``: the app's own."""
    choice = await submitted(state, lambda: to_chat(body), NAMES, steps)
    head, reply, prompt_tokens = MessageHead(state.name), choice.reply, choice.prompt_tokens

    def stop_of() -> str | None:
        return matched_stop(choice.text, state.model.decode_ids, choice.prep.stop)

    if choice.prep.stream:
        events = message_events(head, choice.events, reply.read, prompt_tokens, stop_of, reply.cut)
        return event_stream(events)
    res = await choice.collected(request)
    if res is None:
        return Response(status_code=CLIENT_CLOSED)
    if res.outcome.error is not None:
        raise decode_error(res.outcome.error, res.outcome.cannot_end)
    whole = reply.whole(res.text)
    for call in whole.calls:
        call["id"] = tool_use_id()
    stop = stop_of()
    reason = stop_reason(res.outcome.finish_reason, bool(whole.calls), stop, whole.cut)
    blocks = content_blocks(whole.thought, whole.content, whole.calls)
    return JSONResponse(head.message(blocks, reason, stop, usage_of(prompt_tokens, res.outcome)))


async def count_tokens(state: Any, body: CountTokensRequest, steps: ChatSteps) -> JSONResponse:
    """``{"input_tokens": N}`` (see the module docstring)."""
    prep = await prepared(state, lambda: to_chat(body), steps.prepare, NAMES)
    return JSONResponse({"input_tokens": len(prep.prompt_ids)})

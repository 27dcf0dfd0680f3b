"""A reply with tools as OpenAI answers it: ``message.tool_calls`` whole, or ``delta.tool_calls`` streamed.

Whole: :func:`tool_message` reads the reply (:func:`.parser.parse_reply`) into ``{"role": "assistant",
"content": ..., "tool_calls": [...]}`` (content None when the reply only calls; no ``tool_calls`` key
when it makes none). Streamed: :func:`tool_events` rewrites a choice's events as they come: each text
delta becomes its content text and its ``delta.tool_calls`` entries (a call's first entry carries
``index``, ``id``, ``type`` and ``function.name`` with empty arguments, later ones ``index`` and
``function.arguments`` fragments). Both read the text with the same parser, so the streamed entries
reassemble to the whole reply's calls. A reply that made a call and ended on its own (``stop``)
finishes with ``tool_calls``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from .parser import Arguments, CallStart, Content, Event, ToolCallParser, parse_reply
from .request import ToolPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason(reason: str, called: bool) -> str:
    return "tool_calls" if called and reason == "stop" else reason


def tool_message(plan: ToolPlan, text: str) -> dict[str, Any]:
    """The assistant message of a whole reply (see the module docstring)."""
    reply = parse_reply(text, plan.format, plan.names, call_id)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def delta_entries(events: list[Event]) -> tuple[str, list[dict[str, Any]]]:
    """The content text and the ``delta.tool_calls`` entries of parser events."""
    text, entries = "", []
    for e in events:
        if isinstance(e, Content):
            text += e.text
        elif isinstance(e, CallStart):
            fn = {"name": e.name, "arguments": ""}
            entries.append({"index": e.index, "id": e.id, "type": "function", "function": fn})
        elif isinstance(e, Arguments):
            entries.append({"index": e.index, "function": {"arguments": e.text}})
    return text, entries


async def tool_events(
    events: AsyncIterator[Any], plan: ToolPlan, new_delta: Callable[..., Any]
) -> AsyncIterator[Any]:
    """A choice's deltas and outcome (:mod:`..responses`) with its text read for calls: each delta's
    ``text`` is its content and ``tool_calls`` its entries; the outcome's last delta likewise, and its
    finish reason ``tool_calls`` when the reply called. ``new_delta(text, token_ids)`` makes the last
    delta of an outcome that had none."""
    parser, called = ToolCallParser(plan.format, call_id), False
    async for item in events:
        outcome = hasattr(item, "finish_reason")
        piece = item.last if outcome else item
        got = parser.feed(piece.text if piece is not None else "") + (parser.finish() if outcome else [])
        text, entries = delta_entries(got)
        called = called or any(isinstance(e, CallStart) for e in got)
        if piece is None and (text or entries):
            piece = new_delta(text, [])
        delta = None if piece is None else dataclasses.replace(piece, text=text, tool_calls=entries or None)
        if not outcome:
            yield delta
            continue
        reason = finish_reason(item.finish_reason, called)
        yield dataclasses.replace(item, last=delta, finish_reason=reason)

"""A chat reply as OpenAI answers it, read for its reasoning and its tool calls: ``message`` whole, or
``delta`` entries streamed.

A :class:`ReplyReader` reads the reply's text: the reasoning parser (:mod:`..reasoning.parser`, when the
server has one) splits off the reasoning, and the tool-call reader (:mod:`.parser`, when the request's
tools are read) reads the rest for calls. Whole: :func:`reply_message` gives ``{"role": "assistant",
"content": ..., "reasoning_content": ..., "tool_calls": [...]}`` (content None when the reply only calls;
``reasoning_content`` only with a reasoning parser; no ``tool_calls`` key when it makes none). Streamed:
:func:`reply_events` rewrites a choice's events as they come: each text delta becomes its content text,
its ``reasoning`` and its ``delta.tool_calls`` entries (a call's first entry carries ``index``, ``id``,
``type`` and ``function.name`` with empty arguments, the next its whole ``function.arguments``). Both
read the text with the same readers, so the streamed deltas reassemble to the whole reply.

Finish: a reply that ended inside a call (cut by ``max_tokens`` or a stop string) finishes with
``length`` (its complete calls are returned, the cut one dropped); one that made a call and ended on its
own (``stop``) finishes with ``tool_calls``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..reasoning.parser import Qwen3ReasoningParser, Reasoning, parser_named
from .parser import Arguments, CallStart, Content, Event, ToolCallParser, collect
from .request import ToolPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason(reason: str, called: bool, cut: bool = False) -> str:
    """The choice's finish: ``length`` when cut inside a call, ``tool_calls`` when it called and
    stopped on its own, else the engine's."""
    if cut:
        return "length"
    return "tool_calls" if called and reason == "stop" else reason


@dataclass
class ReplyReader:
    """Reasoning, then content read for calls (see the module docstring)."""

    tools: ToolCallParser | None
    reasoning: Qwen3ReasoningParser | None

    @property
    def cut(self) -> bool:
        return self.tools is not None and self.tools.cut

    def feed(self, text: str) -> list[Event | Reasoning]:
        return self._content(self.reasoning.feed(text) if self.reasoning is not None else [text])

    def finish(self) -> list[Event | Reasoning]:
        out = self._content(self.reasoning.finish() if self.reasoning is not None else [])
        return out + (self.tools.finish() if self.tools is not None else [])

    def _content(self, pieces: list[Reasoning | str]) -> list[Event | Reasoning]:
        out: list[Event | Reasoning] = []
        for p in pieces:
            if isinstance(p, Reasoning):
                out.append(p)
            elif self.tools is not None:
                out += self.tools.feed(p)
            elif p:
                out.append(Content(p))
        return out


def new_reader(tools: ToolPlan | None, reasoning: str | None) -> ReplyReader | None:
    """The reader of a reply with these tools and this reasoning parser (None: the text is plain)."""
    parse = tools is not None and tools.parses
    if not parse and reasoning is None:
        return None
    calls = ToolCallParser(tools.format, call_id, tools.names) if parse else None
    return ReplyReader(calls, parser_named(reasoning) if reasoning is not None else None)


def reply_message(reader: ReplyReader, text: str) -> tuple[dict[str, Any], bool]:
    """The assistant message of a whole reply and whether it was cut inside a call."""
    events = reader.feed(text) + reader.finish()
    reply = collect([e for e in events if not isinstance(e, Reasoning)])
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reader.reasoning is not None:
        thought = "".join(e.text for e in events if isinstance(e, Reasoning))
        message["reasoning_content"] = thought or None
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message, reader.cut


def tool_message(plan: ToolPlan, text: str) -> dict[str, Any]:
    """The assistant message of a whole reply read for calls only."""
    reader = new_reader(plan, None)
    if reader is None:
        return {"role": "assistant", "content": text}
    return reply_message(reader, text)[0]


def delta_entries(events: list[Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """The content text, the reasoning text and the ``delta.tool_calls`` entries of reader events."""
    text, thought, entries = "", "", []
    for e in events:
        if isinstance(e, Content):
            text += e.text
        elif isinstance(e, Reasoning):
            thought += e.text
        elif isinstance(e, CallStart):
            fn = {"name": e.name, "arguments": ""}
            entries.append({"index": e.index, "id": e.id, "type": "function", "function": fn})
        elif isinstance(e, Arguments):
            entries.append({"index": e.index, "function": {"arguments": e.text}})
    return text, thought, entries


async def reply_events(
    events: AsyncIterator[Any], make_reader: Callable[[], ReplyReader], new_delta: Callable[..., Any]
) -> AsyncIterator[Any]:
    """A choice's deltas and outcome (:mod:`..responses`) with its text read: each delta's ``text`` is its
    content, ``reasoning`` its reasoning and ``tool_calls`` its entries; the outcome's last delta
    likewise, and its finish reason as :func:`finish_reason` says. ``new_delta(text, token_ids)``
    makes the last delta of an outcome that had none."""
    reader, called = make_reader(), False
    async for item in events:
        outcome = hasattr(item, "finish_reason")
        piece = item.last if outcome else item
        got = reader.feed(piece.text if piece is not None else "") + (reader.finish() if outcome else [])
        text, thought, entries = delta_entries(got)
        called = called or any(isinstance(e, CallStart) for e in got)
        if piece is None and (text or thought or entries):
            piece = new_delta(text, [])
        if piece is not None:
            read = dict(text=text, reasoning=thought or None, tool_calls=entries or None)
            piece = dataclasses.replace(piece, **read)
        if not outcome:
            yield piece
            continue
        reason = finish_reason(item.finish_reason, called, reader.cut)
        yield dataclasses.replace(item, last=piece, finish_reason=reason)

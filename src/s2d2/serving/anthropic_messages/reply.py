"""The Messages API's answers: the ``message`` object whole, or its server-sent events.

A message's ``content`` is a list of blocks: a ``thinking`` block (the reasoning the server's reasoning
parser split off, as chat's ``reasoning_content``; its ``signature`` empty), ``text`` blocks and one
``tool_use`` block per call (``id`` ``toolu_...``, ``name``, ``input`` the arguments' JSON object), in
the order the model wrote them (a whole reply: thinking, text, then calls, read as chat reads them; a
call cut by a limit is dropped, as chat drops it). ``stop_reason`` is ``max_tokens`` when the token limit
cut the reply (or cut it inside a call), ``stop_sequence`` (with ``stop_sequence`` naming it) when one of
the request's ``stop_sequences`` ended it, ``tool_use`` when the reply called a tool and ended on its
own, else ``end_turn``. ``usage`` counts ``input_tokens`` (the prompt's positions not read
from the prefix cache), ``cache_read_input_tokens`` (those that were) and ``output_tokens``.

Streamed, the events are Anthropic's: ``message_start`` (the message with empty ``content``, null
``stop_reason``), ``ping``, per block ``content_block_start``, its ``content_block_delta`` events
(``thinking_delta`` for thinking, ``text_delta`` for text, ``input_json_delta`` fragments of a call's
``input``), ``content_block_stop``,
then ``message_delta`` (``stop_reason``, ``stop_sequence``, the final ``usage``) and ``message_stop``.
Each event is ``event: <type>`` then ``data: <json>`` whose ``type`` is the same.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..reasoning.parser import Reasoning
from ..tools.parser import Arguments, CallStart, Content
from .errors import error_event


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(finish_reason: str, called: bool, stop_sequence: str | None, cut: bool = False) -> str:
    """Anthropic's ``stop_reason`` (see the module docstring); ``cut``: the reply ended inside a call."""
    if stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "length" or cut:
        return "max_tokens"
    return "tool_use" if called else "end_turn"


def usage_of(prompt_tokens: int, outcome: Any) -> dict[str, int]:
    cached = getattr(getattr(outcome, "stats", None), "cached_prompt_tokens", None) or 0
    return {
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": outcome.completion_tokens,
    }


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped call as a ``tool_use`` block."""
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"])}


def content_blocks(thought: str | None, content: str | None, calls: list[dict[str, Any]]) -> list[dict]:
    """A whole reply's blocks: its thinking and its text (if any), then its calls."""
    blocks = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
    blocks += [{"type": "text", "text": content}] if content else []
    return blocks + [tool_use_block(c) for c in calls]


@dataclass
class MessageHead:
    """What every message object of one reply carries."""

    model: str
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:24]}")

    def message(
        self, content: list[dict[str, Any]], reason: str | None, stop: str | None, usage: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop,
            "usage": usage,
        }


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


class EventWriter:
    """The streamed events of one reply, from the tool reader's events (see the module docstring)."""

    def __init__(self, head: MessageHead):
        self.head = head
        self.index = -1
        self.open: str | None = None  # the open block's type
        self.called = False

    def start(self, prompt_tokens: int) -> list[str]:
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
        message = self.head.message([], None, None, usage)
        return [_event("message_start", message=message), _event("ping")]

    def _begin(self, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return [*out, _event("content_block_start", index=self.index, content_block=block)]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.index)]

    def _delta(self, delta: dict[str, Any]) -> str:
        return _event("content_block_delta", index=self.index, delta=delta)

    def feed(self, events: list[Any]) -> list[str]:
        out: list[str] = []
        for e in events:
            if isinstance(e, Reasoning) and e.text:
                if self.open != "thinking":
                    out += self._begin({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": e.text}))
            elif isinstance(e, Content) and e.text:
                if self.open != "text":
                    out += self._begin({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": e.text}))
            elif isinstance(e, CallStart):
                self.called = True
                block = {"type": "tool_use", "id": tool_use_id(), "name": e.name, "input": {}}
                out += self._begin(block)
            elif isinstance(e, Arguments) and self.open == "tool_use":
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.text}))
        return out

    def finish(self, reason: str, stop: str | None, usage: dict[str, int]) -> list[str]:
        delta = {"stop_reason": reason, "stop_sequence": stop}
        return [*self.close(), _event("message_delta", delta=delta, usage=usage), _event("message_stop")]


async def message_events(
    head: MessageHead,
    deltas: AsyncIterator[Any],
    read: Callable[[str, bool], list[Any]],
    prompt_tokens: int,
    stop_of: Callable[[], str | None],
    cut: Callable[[], bool],
) -> AsyncIterator[str]:
    """The SSE text of one reply: ``deltas`` are the choice's events (:mod:`..responses`); ``read(text,
    final)`` turns text into reader events; ``stop_of()`` names the stop sequence that ended the text
    (None: none did) and ``cut()`` says whether it ended inside a call, both asked once it ended."""
    w = EventWriter(head)
    for line in w.start(prompt_tokens):
        yield line
    async for item in deltas:
        if not hasattr(item, "finish_reason"):
            for line in w.feed(read(item.text, False)):
                yield line
            continue
        if item.error is not None:
            yield error_event(500, f"the request failed while decoding: {item.error}")
            return
        text = item.last.text if item.last is not None else ""
        lines = w.feed(read(text, True))
        stop = stop_of()
        reason = stop_reason(item.finish_reason, w.called, stop, cut())
        for line in lines + w.finish(reason, stop, usage_of(prompt_tokens, item)):
            yield line
        return

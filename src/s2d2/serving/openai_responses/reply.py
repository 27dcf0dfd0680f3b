"""The Responses API's answers: the ``response`` object whole, or its server-sent events.

A reply is a list of output items: a ``reasoning`` item first when the server's reasoning parser split
some off (its text as one ``reasoning_text`` content part, no summary), an assistant ``message`` (its
text as one ``output_text`` part) and one ``function_call`` item per call (``call_id``, ``name``,
``arguments`` as JSON text), in the order the model wrote them. ``status`` is ``completed``, or
``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` when the token limit (or a stop
string inside a call) cut the reply. Streamed, the events are OpenAI's: ``response.created``,
``response.in_progress``, per item ``response.output_item.added``, for reasoning
``response.reasoning_text.delta`` ..., ``response.reasoning_text.done``, for a message
``response.content_part.added``, ``response.output_text.delta`` ..., ``response.output_text.done``,
``response.content_part.done``, for a call ``response.function_call_arguments.delta`` ...,
``response.function_call_arguments.done``, then ``response.output_item.done``, and last
``response.completed`` (or ``response.incomplete``) with the whole response; each event carries its
``sequence_number``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..reasoning.parser import Reasoning
from ..tools.parser import Arguments, CallStart, Content


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@dataclass
class ResponseHead:
    """The request's echo in every response object."""

    model: str
    body: Any
    id: str = field(default_factory=lambda: _id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict:
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature,
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "tools": b.tools or [],
            "top_p": b.top_p,
            "text": b.text or {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": False,
            "metadata": b.metadata or {},
            "usage": usage,
        }


def usage_of(prompt_tokens: int, outcome: Any) -> dict[str, Any]:
    cached = getattr(outcome.stats, "cached_prompt_tokens", 0) if outcome.stats is not None else 0
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + outcome.completion_tokens,
    }


def status_of(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id or _id("msg"),
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def call_item(call_id: str, name: str, arguments: str, status: str = "completed", item_id: str | None = None):
    return {
        "type": "function_call",
        "id": item_id or _id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    part = {"type": "reasoning_text", "text": text}
    return {
        "type": "reasoning",
        "id": item_id or _id("rs"),
        "summary": [],
        "content": [part] if status == "completed" else [],
        "status": status,
    }


def output_items(
    content: str | None, tool_calls: list[dict[str, Any]], reasoning: str | None = None
) -> list[dict[str, Any]]:
    """The output of a whole reply (reasoning first, then content, then the calls)."""
    items = [reasoning_item(reasoning)] if reasoning else []
    items += [message_item(content)] if content else []
    for c in tool_calls:
        items.append(call_item(c["id"], c["function"]["name"], c["function"]["arguments"]))
    return items


class EventWriter:
    """The streamed events of one reply, from the tool reader's events (see the module docstring)."""

    def __init__(self, head: ResponseHead):
        self.head, self.seq = head, 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        r = self.head.response("in_progress", [], None)
        return [self._event("response.created", response=r), self._event("response.in_progress", response=r)]

    def _add(self, item: dict[str, Any]) -> list[str]:
        self.open = item
        self.output.append(item)
        out = [self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)]
        if item["type"] in ("message", "reasoning"):
            item["_text"] = ""
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._part("response.content_part.added", part))
        return out

    def _part(self, kind: str, part: dict[str, Any]) -> str:
        ix = len(self.output) - 1
        return self._event(kind, item_id=self.open["id"], output_index=ix, content_index=0, part=part)

    def close(self) -> list[str]:
        item, out = self.open, []
        if item is None:
            return out
        ix = self.output.index(item)
        if item["type"] == "reasoning":
            text = item.pop("_text")
            fields = dict(item_id=item["id"], output_index=ix, content_index=0, text=text)
            out.append(self._event("response.reasoning_text.done", **fields))
            item.update(reasoning_item(text, item_id=item["id"]))
        elif item["type"] == "message":
            text = item.pop("_text")
            fields = dict(item_id=item["id"], output_index=ix, content_index=0, text=text, logprobs=[])
            out.append(self._event("response.output_text.done", **fields))
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self._part("response.content_part.done", part))
            item.update(message_item(text, item_id=item["id"]))
        else:
            fields = dict(item_id=item["id"], output_index=ix, name=item["name"], arguments=item["arguments"])
            out.append(self._event("response.function_call_arguments.done", **fields))
            item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=ix, item=item))
        self.open = None
        return out

    def _text(self, kind: str, text: str) -> list[str]:
        """A text delta of the open item, opening a ``kind`` item (message or reasoning) first if need be."""
        out: list[str] = []
        if self.open is None or self.open["type"] != kind:
            new = message_item if kind == "message" else reasoning_item
            out += self.close() + self._add(new("", "in_progress"))
        self.open["_text"] += text
        fields = dict(item_id=self.open["id"], output_index=len(self.output) - 1, content_index=0, delta=text)
        if kind == "message":
            out.append(self._event("response.output_text.delta", **fields, logprobs=[]))
        else:
            out.append(self._event("response.reasoning_text.delta", **fields))
        return out

    def feed(self, events: list[Any]) -> list[str]:
        out: list[str] = []
        for e in events:
            if isinstance(e, Reasoning) and e.text:
                out += self._text("reasoning", e.text)
            elif isinstance(e, Content) and e.text:
                out += self._text("message", e.text)
            elif isinstance(e, CallStart):
                out += self.close() + self._add(call_item(e.id, e.name, "", "in_progress"))
            elif isinstance(e, Arguments) and self.open is not None:
                self.open["arguments"] += e.text
                ix = len(self.output) - 1
                fields = dict(item_id=self.open["id"], output_index=ix, delta=e.text)
                out.append(self._event("response.function_call_arguments.delta", **fields))
        return out

    def finish(self, outcome: Any, prompt_tokens: int, cut: bool = False) -> list[str]:
        """The last events; ``cut``: the reply ended inside a call (incomplete, as by the token limit)."""
        out = self.close()
        status = "incomplete" if cut else status_of(outcome.finish_reason)
        r = self.head.response(status, self.output, usage_of(prompt_tokens, outcome))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(kind, response=r)]


async def response_events(
    head: ResponseHead, deltas: AsyncIterator[Any], read: Any, prompt_tokens: int, cut: Any = lambda: False
):
    """The SSE text of one reply: ``deltas`` are the choice's events (:mod:`..responses`); ``read(text,
    final)`` turns text into reader events (plain content when the request reads neither tools nor
    reasoning); ``cut()``: whether the reply ended inside a call."""
    w = EventWriter(head)
    for line in w.start():
        yield line
    async for item in deltas:
        if hasattr(item, "finish_reason"):
            if item.error is not None:
                yield w._event("error", code="decode_failed", message=item.error, param=None)
                return
            text = item.last.text if item.last is not None else ""
            lines = w.feed(read(text, True))
            for line in lines + w.finish(item, prompt_tokens, cut()):
                yield line
            return
        for line in w.feed(read(item.text, False)):
            yield line

"""One submitted request's text, as OpenAI responses: a JSON body, or server-sent event chunks.

:func:`text_events` is the one place a request's outputs turn into text: it feeds the engine's final
token ids to a :class:`TextStream`, aborts the request when a stop string appears (the engine then frees
the row at its next step) or when the consumer goes away (a client disconnect cancels the consumer), and
ends with an :class:`Outcome`. The streamed and non-streamed bodies are both built from it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .detokenizer import TextStream
from .engine_thread import EngineThread, Submission
from .errors import APIError


@dataclass
class Outcome:
    """How a request ended."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: Any = None
    error: str | None = None

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def s2d2(self) -> dict[str, Any]:
        s = self.stats
        return {
            "nfe": s.nfe,
            "nfe_per_token": s.nfe / max(self.completion_tokens, 1),
            "verify_steps": s.verify_steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "finish_reason": s.finish_reason,
        }


async def text_events(
    engine: EngineThread, sub: Submission, text: TextStream
) -> AsyncIterator[str | Outcome]:
    """New text pieces as they become final, then the :class:`Outcome` (see the module docstring)."""
    done = stop_sent = False
    try:
        while True:
            out = await sub.outputs.get()
            ids = list(out.new_token_ids)
            while not out.finished and not sub.outputs.empty():  # a consumer that fell behind: one chunk
                out = sub.outputs.get_nowait()
                ids += out.new_token_ids
            piece = text.push(ids)
            if text.stopped and not stop_sent and not out.finished:
                engine.abort(sub.request_id)
                stop_sent = True
            if piece:
                yield piece
            if out.finished:
                done = True
                break
    finally:
        if not done:
            engine.abort(sub.request_id)
    result = out.output
    if result.status == "failed":
        yield Outcome("error", len(sub.prompt_ids), len(text.ids), result.stats, result.error or "failed")
        return
    tail = text.finish()
    if tail:
        yield tail
    if text.stopped:
        reason = "stop"
    elif result.status == "aborted":
        reason = "abort"
    else:
        reason = "stop" if result.stats.finish_reason == "stop" else "length"
    yield Outcome(reason, len(sub.prompt_ids), len(text.ids), result.stats)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def collect(
    events: AsyncIterator[str | Outcome], is_disconnected: Callable[[], Awaitable[bool]]
) -> tuple[str, Outcome]:
    """The whole text and the outcome; a client that disconnects meanwhile aborts the request."""

    async def consume() -> tuple[str, Outcome]:
        parts: list[str] = []
        async for item in events:
            if isinstance(item, Outcome):
                return "".join(parts), item
            parts.append(item)
        raise RuntimeError("the request ended without an outcome")

    task = asyncio.ensure_future(consume())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                break
            if await is_disconnected():
                task.cancel()
                break
        return await task
    finally:
        if not task.done():
            task.cancel()


def completion_body(text: str, outcome: Outcome, *, chat: bool, model: str) -> dict[str, Any]:
    """The non-streamed response (raises a 500 APIError if the request failed inside the engine)."""
    if outcome.error is not None:
        raise APIError(500, f"the request failed while decoding: {outcome.error}", code="decode_failed")
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": outcome.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": outcome.usage(),
        "s2d2": outcome.s2d2(),
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def sse_chunks(
    events: AsyncIterator[str | Outcome], *, chat: bool, model: str, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending in ``data: [DONE]``."""
    head = {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(piece: str | None, finish: str | None, **more: Any) -> str:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            choice["delta"] = {} if piece is None else {"content": piece}
        else:
            choice["text"] = piece or ""
        return _sse({**head, "choices": [choice], **extra, **more})

    if chat:
        yield _sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                **extra,
            }
        )
    async for item in events:
        if isinstance(item, str):
            yield chunk(item, None)
            continue
        if item.error is not None:
            err = APIError(500, f"the request failed while decoding: {item.error}", code="decode_failed")
            yield _sse(err.body())
        else:
            yield chunk(None, item.finish_reason, s2d2=item.s2d2())
            if include_usage:
                yield _sse({**head, "choices": [], "usage": item.usage(), "s2d2": item.s2d2()})
    yield "data: [DONE]\n\n"

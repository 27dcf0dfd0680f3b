"""A request's choices as OpenAI responses: a JSON body, or server-sent event chunks.

:func:`text_events` is the one place a choice's engine outputs turn into text: it feeds the engine's
final token ids to a :class:`TextStream`, aborts the engine request when a stop string appears (the
engine frees the row at its next step) or when the consumer goes away (a client disconnect cancels the
consumer), and ends with an :class:`Outcome`. Each :class:`Delta` carries the counted tokens behind its
text (through the stop string's end, never past it) and their logprobs when asked for. The streamed and
non-streamed bodies are both built from it; several choices (``n``, lists of prompts) are several engine
requests, collected together (:func:`collect_all`) or interleaved as they come (:func:`sse_chunks`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from ..errors import RequestCannotEnd
from .detokenizer import TextStream
from .engine_thread import EngineThread, GroupFailed, Submission
from .errors import decode_error
from .merged_events import merged
from .prepare import Prepared
from .token_logprobs import (
    Scored,
    TokenTexts,
    chat_format,
    completion_format,
    prompt_logprobs_format,
    scored_tokens,
)
from .tools.reply import finish_reason, new_reader, reply_message


@dataclass
class Delta:
    """Text that became final, the counted tokens behind it and (when asked for) their logprobs."""

    text: str
    token_ids: list[int]
    logprobs: list[Any] | None = None
    #: chat with tools: the ``delta.tool_calls`` entries read from this text (``text`` is then the content)
    tool_calls: list[Any] | None = None
    #: chat with a reasoning parser: the reasoning read from this text (``text`` is then the content)
    reasoning: str | None = None


@dataclass
class Outcome:
    """How a choice ended; ``completion_tokens`` counts the tokens of its returned text."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: Any = None
    error: str | None = None
    cannot_end: bool = False  # it failed as a request that cannot end (RequestCannotEnd): a 422
    #: it failed because the model's tensor-parallel group broke (GroupFailed): a 503
    unavailable: bool = False
    #: the text (and tokens) that became final with the engine's last output: it rides with the finish
    last: Delta | None = None


@dataclass
class ChoiceResult:
    """One choice, collected whole."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = field(default_factory=list)
    outcome: Outcome | None = None

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        if self.logprobs is not None and delta.logprobs is not None:
            self.logprobs += delta.logprobs
        else:
            self.logprobs = None


def _take(sub: Submission, out: Any) -> tuple[Any, list[int], list[Any]]:
    """``out`` and, if the consumer fell behind, every output queued after it, as one."""
    ids, lps = list(out.new_token_ids), list(out.new_logprobs or [])
    while not out.finished and not sub.outputs.empty():
        out = sub.outputs.get_nowait()
        ids += out.new_token_ids
        lps += out.new_logprobs or []
    return out, ids, lps


async def text_events(
    engine: EngineThread, sub: Submission, text: TextStream, *, logprobs: bool = False
) -> AsyncIterator[Delta | Outcome]:
    """:class:`Delta` items as text becomes final, then the :class:`Outcome` (see the module docstring)."""
    done = stop_sent = False
    counted, lps = 0, []

    def delta(piece: str) -> Delta:
        nonlocal counted
        n = text.n_tokens
        entries = lps[counted:n] if logprobs and len(lps) >= n else None
        d = Delta(piece, text.ids[counted:n], entries)
        counted = n
        return d

    try:
        while True:
            out, ids, new_lps = _take(sub, await sub.outputs.get())
            before = len(text.ids)
            piece = text.push(ids)
            lps += new_lps[: len(text.ids) - before]
            if out.finished:
                done = True
                break
            if text.stopped and not stop_sent:
                engine.abort(sub.request_id)
                stop_sent = True
            if piece or text.n_tokens > counted:
                yield delta(piece)
    finally:
        if not done:
            engine.abort(sub.request_id)
    result = out.output
    if result.status == "failed":
        why, cannot = result.error or "failed", isinstance(result.exception, RequestCannotEnd)
        gone = isinstance(result.exception, GroupFailed)
        yield Outcome("error", len(sub.prompt_ids), text.n_tokens, result.stats, why, cannot, gone)
        return
    tail = piece + text.finish()
    last = delta(tail) if tail or text.n_tokens > counted else None
    if text.stopped:
        reason = "stop"
    elif result.status == "aborted":
        reason = "abort"
    else:
        reason = "stop" if result.stats.finish_reason == "stop" else "length"
    yield Outcome(reason, len(sub.prompt_ids), text.n_tokens, result.stats, last=last)


@dataclass(frozen=True)
class NoDecoding:
    """The statistics of a choice that decoded nothing (``max_tokens: 0`` with ``echo``)."""

    nfe: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    finish_reason: str = "length"
    cached_prompt_tokens: int = 0


async def score_only_events(row: Any) -> AsyncIterator[Delta | Outcome]:
    """A choice that only scores its prompt: its :class:`Outcome` at once (no engine request)."""
    yield Outcome("length", len(row.prompt_ids), 0, NoDecoding())


async def _collect_one(events: AsyncIterator[Delta | Outcome]) -> ChoiceResult:
    result = ChoiceResult()
    async for item in events:
        if isinstance(item, Outcome):
            if item.last is not None:
                result.add(item.last)
            result.outcome = item
            return result
        result.add(item)
    raise RuntimeError("the request ended without an outcome")


async def collect_all(
    streams: Sequence[AsyncIterator[Delta | Outcome]], is_disconnected: Callable[[], Awaitable[bool]]
) -> list[ChoiceResult] | None:
    """Every choice whole, or None if the client disconnected meanwhile (each choice is then aborted)."""
    task = asyncio.ensure_future(asyncio.gather(*(_collect_one(s) for s in streams)))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await is_disconnected():
                return None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------------------------- bodies
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prep: Prepared, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Each prompt counted once, each choice's returned tokens; ``prompt_tokens_details.cached_tokens``:
    the prompt positions whose keys and values came from the prefix cache, summed over the choices
    (each choice is an engine request of its own, so ``n`` > 1 choices of one prompt each count theirs)."""
    prompt = sum(len(p) for p in prep.prompts)
    completion = sum(o.completion_tokens for o in outcomes)
    cached = sum(getattr(o.stats, "cached_prompt_tokens", 0) for o in outcomes if o.stats is not None)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def s2d2_stats(prep: Prepared, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The ``s2d2`` object: decoding statistics summed over ``outcomes``, the acceptance rule used (strict,
    probabilistic, or none: no verification), notes."""
    stats, cfg = [o.stats for o in outcomes], prep.config
    rule = "none" if cfg.decoder != "s2d2" else "strict" if cfg.strict else "probabilistic"
    nfe = sum(s.nfe for s in stats)
    tokens = sum(o.completion_tokens for o in outcomes)
    return {
        "nfe": nfe,
        "nfe_per_token": nfe / max(tokens, 1),
        "verify_steps": sum(s.verify_steps for s in stats),
        "drafted": sum(s.drafted for s in stats),
        "accepted": sum(s.accepted for s in stats),
        "finish_reason": stats[0].finish_reason if len(stats) == 1 else None,
        "acceptance": rule,
        "notes": list(prep.notes),
    }


@dataclass
class Renderer:
    """What the bodies need besides the choices: the request, the model's decoding function, the served
    name and (echo with logprobs, prompt_logprobs) each prompt's scored tokens."""

    prep: Prepared
    chat: bool
    model: str
    decode: Callable[[list[int]], str]
    prompt_scores: list[Scored] | None = None

    def echo_text(self, row: Any) -> str:
        return self.prep.prompt_texts[row.prompt_index] if self.prep.echo else ""

    def logprobs(self, scored: Scored | None, offset: int = 0) -> dict[str, Any] | None:
        k = self.prep.logprobs
        if scored is None or k is None:
            return None
        if self.chat:
            return chat_format(scored, k)
        return completion_format(scored, k, offset)

    def scored(self, pieces: TokenTexts, delta_ids: list[int], entries: list[Any] | None) -> Scored | None:
        """The tokens' text pieces and logprobs (None, with nothing decoded, when none are reported)."""
        if entries is None or self.prep.logprobs is None:
            return None
        return scored_tokens(pieces, delta_ids, entries)

    def head(self) -> dict[str, Any]:
        return {
            "id": new_id("chatcmpl" if self.chat else "cmpl"),
            "created": int(time.time()),
            "model": self.model,
        }


def completion_body(r: Renderer, results: Sequence[ChoiceResult]) -> dict[str, Any]:
    """The non-streamed response (raises a 500 APIError if a choice failed inside the engine)."""
    outcomes = [res.outcome for res in results]
    for o in outcomes:
        if o.error is not None:
            raise decode_error(o.error, o.cannot_end, o.unavailable)
    choices = []
    for row, res in zip(r.prep.rows, results, strict=True):
        echo = r.echo_text(row)
        scored = r.scored(TokenTexts(r.decode), res.token_ids, res.logprobs)
        if scored is not None and r.prep.echo and r.prompt_scores is not None:
            whole = Scored()
            whole.extend(r.prompt_scores[row.prompt_index])
            whole.extend(scored)
            scored = whole
        choice: dict[str, Any] = {"index": row.index, "logprobs": r.logprobs(scored)}
        choice["finish_reason"] = res.outcome.finish_reason
        if r.prep.prompt_logprobs is not None and r.prompt_scores is not None:
            scores = r.prompt_scores[row.prompt_index]
            choice["prompt_logprobs"] = prompt_logprobs_format(scores, r.prep.prompt_logprobs)
        reader = new_reader(r.prep.tools, r.prep.reasoning) if r.chat else None
        if reader is not None:
            choice["message"], cut = reply_message(reader, res.text)
            called = "tool_calls" in choice["message"]
            choice["finish_reason"] = finish_reason(res.outcome.finish_reason, called, cut)
        elif r.chat:
            choice["message"] = {"role": "assistant", "content": res.text}
        else:
            choice["text"] = echo + res.text
        choices.append(choice)
    return {
        **r.head(),
        "object": "chat.completion" if r.chat else "text_completion",
        "choices": choices,
        "usage": usage(r.prep, outcomes),
        "s2d2": s2d2_stats(r.prep, outcomes),
    }


def _tool_delta(d: Delta) -> dict[str, Any] | None:
    """A chat delta with ``reasoning_content`` or ``tool_calls`` entries (None: the plain
    ``{"content": ...}`` delta)."""
    if d.tool_calls is None and d.reasoning is None:
        return None
    out: dict[str, Any] = {"content": d.text} if d.text else {}
    if d.reasoning is not None:
        out["reasoning_content"] = d.reasoning
    if d.tool_calls is not None:
        out["tool_calls"] = d.tool_calls
    return out


def event_stream(chunks: AsyncIterator[str]) -> StreamingResponse:
    """The answer streaming ``chunks`` as server-sent events (neither cached nor buffered by a proxy)."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class _ChoiceStream:
    """A streamed choice's state: its tokens' text pieces and where its next token's text starts."""

    pieces: TokenTexts
    offset: int = 0


def _first_chunks(r: Renderer, chunk: Callable[..., str]) -> list[str]:
    """Before any text: the chat role of each choice, or (echo) each choice's prompt text."""
    out = []
    for row in r.prep.rows:
        if r.chat:
            out.append(chunk(row.index, delta={"role": "assistant", "content": ""}))
        elif r.prep.echo:
            scores = r.prompt_scores[row.prompt_index] if r.prompt_scores is not None else None
            out.append(chunk(row.index, text=r.echo_text(row), logprobs=r.logprobs(scores)))
    return out


async def sse_chunks(r: Renderer, streams: Sequence[AsyncIterator[Delta | Outcome]]) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending in ``data: [DONE]``."""
    head = {**r.head(), "object": "chat.completion.chunk" if r.chat else "text_completion"}
    extra = {"usage": None} if r.prep.include_usage else {}

    def chunk(
        index: int,
        *,
        text: str | None = None,
        delta: Any = None,
        logprobs: Any = None,
        finish: str | None = None,
        **more: Any,
    ) -> str:
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
        if r.chat:
            choice["delta"] = delta if delta is not None else ({} if text is None else {"content": text})
        else:
            choice["text"] = text or ""
        return _sse({**head, "choices": [choice], **extra, **more})

    for first in _first_chunks(r, chunk):
        yield first
    states = [_ChoiceStream(TokenTexts(r.decode), len(r.echo_text(row))) for row in r.prep.rows]
    outcomes: list[Outcome | None] = [None] * len(states)
    async for i, item in merged(streams):
        index, st = r.prep.rows[i].index, states[i]
        if isinstance(item, Delta):
            scored = r.scored(st.pieces, item.token_ids, item.logprobs)
            logprobs = r.logprobs(scored, st.offset)
            yield chunk(index, text=item.text, delta=_tool_delta(item), logprobs=logprobs)
            st.offset += sum(len(t) for t in scored.texts) if scored is not None else 0
            continue
        outcomes[i] = item
        if item.error is not None:
            yield _sse(decode_error(item.error, item.cannot_end, item.unavailable).body())
            continue
        text, logprobs, delta = None, None, None
        if item.last is not None:
            text, delta = item.last.text or None, _tool_delta(item.last)
            logprobs = r.logprobs(r.scored(st.pieces, item.last.token_ids, item.last.logprobs), st.offset)
        stats = s2d2_stats(r.prep, [item])
        yield chunk(index, text=text, delta=delta, logprobs=logprobs, finish=item.finish_reason, s2d2=stats)
    done = [o for o in outcomes if o is not None]
    if r.prep.include_usage and len(done) == len(outcomes):
        yield _sse({**head, "choices": [], "usage": usage(r.prep, done), "s2d2": s2d2_stats(r.prep, done)})
    yield "data: [DONE]\n\n"

"""What the APIs answered through a translated chat request share (Anthropic's Messages,
:mod:`.anthropic_messages`; OpenAI's Responses, :mod:`.openai_responses`).

Each API's request becomes a :class:`~.protocol.ChatCompletionRequest` (:func:`chat_request`), prepared by
the chat path with its errors' ``param`` renamed to the API's own field names (:class:`FieldNames`,
:func:`prepared`). The one choice's text is read for reasoning and tool calls by :class:`ReplyText`, piece
by piece for the API's events or whole for its body; :func:`submitted` runs these first steps of an
answer.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from .detokenizer import TextStream
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest
from .responses import ChoiceResult, collect_all, text_events
from .tools.parser import Content
from .tools.reply import ReplyReader, new_reader, reply_message


@dataclass(frozen=True)
class FieldNames:
    """How an API names the chat request's fields: ``params`` renames a whole ``param``, then each
    ``(pattern, replacement)`` of ``patterns`` is substituted in turn (regular expressions)."""

    params: dict[str, str]
    patterns: Sequence[tuple[str, str]]

    def renamed(self, exc: APIError) -> APIError:
        """``exc`` with its ``param`` (a chat field's path, if any) as the API names it."""
        if exc.param is not None:
            param = self.params.get(exc.param, exc.param)
            for pattern, replacement in self.patterns:
                param = re.sub(pattern, replacement, param)
            exc.param = param
        return exc


async def prepared(
    state: Any, to_chat: Callable[[], Any], prepare: Callable[[Any, Any], Any], names: FieldNames
) -> Any:
    """``prepare(state, to_chat())`` off the event loop; an :class:`APIError` of either is raised with its
    ``param`` as the API names it."""
    try:
        return await asyncio.to_thread(lambda: prepare(state, to_chat()))
    except APIError as exc:
        raise names.renamed(exc) from None


def chat_request(chat: dict[str, Any], s2d2: Any, field: str) -> ChatCompletionRequest:
    """The chat request of ``chat``'s fields that are not None, with the ``s2d2`` settings object (a
    pydantic model, or None); a 400 naming the API's ``field`` (its conversation) when it is not valid."""
    if s2d2 is not None:
        chat["s2d2"] = s2d2.model_dump(exclude_none=True)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValueError as exc:
        raise bad_request(f"{field}: {str(exc).splitlines()[0]}", param=field) from None


@dataclass
class WholeReply:
    """A whole reply read: its content (None when it only calls), tool calls, reasoning (None: none read)
    and whether it was cut inside a call."""

    content: str | None
    calls: list[dict[str, Any]]
    thought: str | None
    cut: bool


@dataclass
class ReplyText:
    """A reply's text read by ``reader`` (:func:`~.tools.reply.new_reader`; None: the text is plain
    content)."""

    reader: ReplyReader | None

    def read(self, text: str, final: bool) -> list[Any]:
        """The events of the next piece of streamed text (``final``: the last piece; the reader's end is
        read with it)."""
        if self.reader is None:
            return [Content(text)]
        return self.reader.feed(text) + (self.reader.finish() if final else [])

    def cut(self) -> bool:
        """Whether the streamed reply ended inside a call (asked once it ended)."""
        return self.reader is not None and self.reader.cut

    def whole(self, text: str) -> WholeReply:
        """The whole reply ``text`` read (a fresh reader: not also fed piece by piece)."""
        if self.reader is None:
            return WholeReply(text, [], None, False)
        message, cut = reply_message(self.reader, text)
        calls, thought = message.get("tool_calls", []), message.get("reasoning_content")
        return WholeReply(message["content"], calls, thought, cut)


@dataclass(frozen=True)
class ChatSteps:
    """The app's own steps of a chat request: ``prepare(state, chat)`` checks and tokenises it (run in a
    worker thread); ``submit(state, prepared)`` queues its engine requests, one per choice."""

    prepare: Callable[[Any, Any], Any]
    submit: Callable[[Any, Any], Awaitable[list[Any]]]


@dataclass
class TranslatedChoice:
    """A translated request's one choice, submitted: the prepared chat request, the text its engine
    outputs become, its events (:func:`~.responses.text_events`) and its reply's reader."""

    prep: Any
    text: TextStream
    events: AsyncIterator[Any]
    reply: ReplyText

    @property
    def prompt_tokens(self) -> int:
        return len(self.prep.prompt_ids)

    async def collected(self, request: Request) -> ChoiceResult | None:
        """The choice whole, or None if the client disconnected meanwhile (the choice is then aborted)."""
        results = await collect_all([self.events], request.is_disconnected)
        return None if results is None else results[0]


async def submitted(
    state: Any, to_chat: Callable[[], Any], names: FieldNames, steps: ChatSteps
) -> TranslatedChoice:
    """The request's chat request (``to_chat()``) prepared (:func:`prepared`) and submitted."""
    prep = await prepared(state, to_chat, steps.prepare, names)
    sub = (await steps.submit(state, prep))[0]
    text = TextStream(state.model.decode_ids, prep.stop)
    events = text_events(state.engine, sub, text)
    return TranslatedChoice(prep, text, events, ReplyText(new_reader(prep.tools, prep.reasoning)))

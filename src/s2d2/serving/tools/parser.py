"""Reading tool calls out of a model's text, incrementally: content, call starts, argument fragments.

:class:`ToolCallParser` is fed the reply's text in pieces (as it becomes final) and returns events:
``Content(text)``, ``CallStart(index, id, name)`` and ``Arguments(index, text)``. Its decisions depend
only on the text seen so far and whatever it returns is final, so any split of the same text gives the
same content and the same calls: the streamed deltas reassemble to exactly the non-streamed reply
(:func:`parse_reply` feeds the whole text at once).

The format's markup never reaches the content: text that may be the start of the trigger is held until
it is known; whitespace between text and a call, between calls and after the last call is dropped. A
call's arguments are the JSON value after ``"arguments":``, verbatim (as the model wrote it, which the
structural tag keeps compact and within the schema), cut where that value closes. A call is returned
only once its arguments have closed (``CallStart`` and its whole ``Arguments`` together), so a reply cut
inside a call (by ``max_tokens`` or a stop string) returns every complete call and drops the cut one:
its markup never reaches the content, and :attr:`ToolCallParser.cut` says so. A complete call whose
name is no tool's or whose arguments are no JSON object is returned as text, as is text after a trigger
that does not read as a call's head (``{"name": "...", "arguments": ``); never an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..held_text import held_prefix
from .formats import ToolFormat

#: A call's head, read leniently (the constrained output is exactly the format's begin text)
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')
#: Characters after a trigger within which a call's head must have appeared
MAX_HEAD = 512


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class Arguments:
    index: int
    text: str


Event = Content | CallStart | Arguments


@dataclass
class _Json:
    """Where a JSON value being read closes (depth, strings and escapes tracked)."""

    depth: int = 0
    started: bool = False
    in_string: bool = False
    escape: bool = False

    def feed(self, ch: str) -> bool:
        """Read one character; True once the value has closed with it."""
        self.started = True
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
            return False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return self.depth <= 0
        return False


@dataclass
class ToolCallParser:
    """The incremental reader (see the module docstring); ``new_id()`` names each call; ``names``: the
    tools' names (None: any name); ``cut``: set by :meth:`finish` when the text ended inside a call."""

    format: ToolFormat
    new_id: Callable[[], str]
    names: set[str] | None = None
    state: str = "text"
    buf: str = ""
    held_ws: str = ""
    skip_ws: bool = False
    calls: int = 0
    json: _Json = field(default_factory=_Json)
    cut: bool = False
    #: the call being read: its name, its raw text since the trigger, its arguments so far
    name: str = ""
    raw: str = ""
    arguments: str = ""

    @property
    def close(self) -> str:
        return self.format.end.lstrip("}").strip()

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            step = getattr(self, f"_{self.state}")(out)
            if not step:
                return out

    def finish(self) -> list[Event]:
        """The events the end of the text decides: held text is content; a call cut short (a head that
        may still become one, arguments not closed, the closing tag missing, or after a call the start
        of a trigger) is dropped and :attr:`cut` set."""
        out: list[Event] = []
        if self.state == "head":
            if self._may_be_head(self.buf):
                self.cut = True
            else:
                self._text_out(out, self.format.trigger + self.buf)
        elif self.state == "text" and self.calls and self.buf:  # the start of a next call's trigger
            self.cut = True
        elif self.state == "text":
            self._text_out(out, self.buf)
        else:  # inside the arguments, or before the closing tag
            self.cut = True
        self.buf, self.state = "", "text"
        if self.held_ws and not self.calls:
            out.append(Content(self.held_ws))
        self.held_ws = ""
        return out

    def _may_be_head(self, text: str) -> bool:
        """Whether ``text`` (after a trigger) may be the start of a call's head."""
        rest = self.format.begin[len(self.format.trigger) :]
        return rest.startswith(text) or text.startswith(rest) or _HEAD.match(text) is not None

    # ----------------------------------------------------------------- states: each returns "go on"
    def _text(self, out: list[Event]) -> bool:
        k = self.buf.find(self.format.trigger)
        if k < 0:
            keep = held_prefix(self.buf, self.format.trigger)
            self._text_out(out, self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            return False
        self._text_out(out, self.buf[:k])
        self.held_ws = ""  # whitespace before a call is dropped
        self.buf, self.state = self.buf[k + len(self.format.trigger) :], "head"
        return True

    def _head(self, out: list[Event]) -> bool:
        m = _HEAD.match(self.buf)
        if m is None:
            if self.close in self.buf or len(self.buf) >= MAX_HEAD:  # no call: the text is content
                self._text_out(out, self.format.trigger)
                self.state = "text"
                return True
            return False
        self.name, self.raw, self.arguments = m.group(1), self.format.trigger + self.buf[: m.end()], ""
        self.buf, self.state, self.json = self.buf[m.end() :], "arguments", _Json()
        return True

    def _arguments(self, out: list[Event]) -> bool:
        if not self.json.started:
            self.buf = self.buf.lstrip()
        for i, ch in enumerate(self.buf):
            if self.json.feed(ch):
                self.arguments += self.buf[: i + 1]
                self.buf = self.buf[i + 1 :]
                return self._call_read(out)
        self.arguments += self.buf
        self.buf = ""
        return False

    def _call_read(self, out: list[Event]) -> bool:
        """The arguments closed: a valid call is returned whole; an invalid one is text."""
        try:
            valid = isinstance(json.loads(self.arguments), dict)
        except json.JSONDecodeError:
            valid = False
        if valid and (self.names is None or self.name in self.names):
            out.append(CallStart(self.calls, self.new_id(), self.name))
            out.append(Arguments(self.calls, self.arguments))
            self.state = "tail"
            return True
        self._text_out(out, self.raw + self.arguments)
        self.state = "text"
        return True

    def _tail(self, out: list[Event]) -> bool:
        k = self.buf.find(self.close)
        if k < 0:
            return False
        self.buf, self.state = self.buf[k + len(self.close) :], "text"
        self.calls += 1
        self.skip_ws = True
        return True

    def _text_out(self, out: list[Event], text: str) -> None:
        if self.skip_ws:
            text = text.lstrip()
            self.skip_ws = not text
        if not text:
            return
        body = text.rstrip()
        if body:
            out.append(Content(self.held_ws + body))
            self.held_ws = ""
        self.held_ws += text[len(body) :]


@dataclass
class Reply:
    """A reply read whole: its content (None when it only calls), its calls (OpenAI's shape) and whether
    it ended inside a call (that call dropped)."""

    content: str | None
    tool_calls: list[dict]
    cut: bool = False


def collect(events: list[Event]) -> Reply:
    text, calls = "", []
    for e in events:
        if isinstance(e, Content):
            text += e.text
        elif isinstance(e, CallStart):
            calls.append({"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}})
        else:
            calls[e.index]["function"]["arguments"] += e.text
    return Reply(text if text or not calls else None, calls)


def parse_reply(text: str, fmt: ToolFormat, names: set[str] | None, new_id: Callable[[], str]) -> Reply:
    """The whole reply's content and calls, and whether it ended inside a call (the reader's ``cut``)."""
    parser = ToolCallParser(fmt, new_id, names)
    reply = collect(parser.feed(text) + parser.finish())
    reply.cut = parser.cut
    return reply

"""Reading a reply's reasoning out of its text, incrementally: Qwen3's ``<think>…</think>`` block.

:class:`Qwen3ReasoningParser` is fed the reply's text in pieces and returns :class:`Reasoning` items and
content strings. A reply whose text (after leading whitespace) opens with ``<think>`` reasons until
``</think>``; everything after it is content. A reply that does not open with ``<think>`` is all content
(the template wrote an empty think block itself when ``enable_thinking`` is false). A reply cut before
``</think>`` (by ``max_tokens`` or a stop string) is all reasoning. Whitespace right after ``<think>``,
before ``</think>`` and right after ``</think>`` is dropped. Its decisions depend only on the text seen
so far and what it returns is final, so any split of the same text gives the same reasoning and content:
streamed deltas reassemble to exactly the whole reply.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..held_text import held_prefix

THINK, END_THINK = "<think>", "</think>"


@dataclass
class Reasoning:
    """Reasoning text (``reasoning_content``)."""

    text: str


@dataclass
class Qwen3ReasoningParser:
    """The incremental reader (see the module docstring); ``state``: start, think or content."""

    state: str = "start"
    buf: str = ""
    #: whitespace at the reasoning's end so far (dropped if ``</think>`` follows)
    held: str = ""
    #: leading whitespace is still to be dropped (after ``<think>`` or ``</think>``)
    lead: bool = False

    def feed(self, text: str) -> list[Reasoning | str]:
        self.buf += text
        out: list[Reasoning | str] = []
        while getattr(self, f"_{self.state}")(out):
            pass
        return out

    def finish(self) -> list[Reasoning | str]:
        """What the end of the text decides: held text is content (start) or reasoning (a cut think)."""
        out: list[Reasoning | str] = []
        if self.state == "start" and self.buf:
            out.append(self.buf)
        elif self.state == "think":
            self._reason(out, self.buf, final=True)
        self.buf = ""
        return out

    def _start(self, out: list[Reasoning | str]) -> bool:
        head = self.buf.lstrip()
        if head.startswith(THINK):
            self.buf, self.state, self.lead = head[len(THINK) :], "think", True
            return True
        if THINK.startswith(head):  # may still open a think block
            return False
        self.state = "content"
        return True

    def _past_lead(self) -> bool:
        """Drop the whitespace leading a section; False while that is all of the text so far."""
        if self.lead:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return False
            self.lead = False
        return True

    def _think(self, out: list[Reasoning | str]) -> bool:
        if not self._past_lead():
            return False
        k = self.buf.find(END_THINK)
        if k >= 0:
            self._reason(out, self.buf[:k], final=True)
            self.buf, self.state, self.lead = self.buf[k + len(END_THINK) :], "content", True
            return True
        keep = held_prefix(self.buf, END_THINK)
        self._reason(out, self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return False

    def _reason(self, out: list[Reasoning | str], text: str, final: bool = False) -> None:
        text = self.held + text
        body = text.rstrip()
        if body:
            out.append(Reasoning(body))
        self.held = "" if final else text[len(body) :]

    def _content(self, out: list[Reasoning | str]) -> bool:
        if not self._past_lead():
            return False
        if self.buf:
            out.append(self.buf)
            self.buf = ""
        return False


#: The reasoning parsers, by the names vLLM's ``--reasoning-parser`` uses.
PARSERS = {"qwen3": Qwen3ReasoningParser}


def parser_named(name: str) -> Qwen3ReasoningParser:
    """A new parser of the kind ``name`` names (a KeyError for an unknown name: see :data:`PARSERS`)."""
    return PARSERS[name]()

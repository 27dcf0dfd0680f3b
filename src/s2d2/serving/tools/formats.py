"""The tool-call markups the server reads and writes, by the names vLLM's ``--tool-call-parser`` uses.

A :class:`ToolFormat` is one model family's way of writing a call in its output: Qwen/Hermes (``hermes``;
SDAR-Chat and Fast-dLLM v2 inherit it from Qwen) writes each call as
``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>``, calls separated by a newline.
LLaDA2.x (``llada2``, the Ling 2.0 chat template's markup) writes a call in the same ``<tool_call>``
JSON markup, after a newline when text or another call precedes it; its template differs in the roles
around it (``<role>OBSERVATION</role>`` turns hold the tools' results), which :func:`detect_format` reads.

The format is chosen with ``--tool-call-parser NAME`` or detected from the chat template
(:func:`detect_format`; ``hermes`` when the template says nothing about tool calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError


@dataclass(frozen=True)
class ToolFormat:
    """One call is ``begin + name + middle + arguments + end``; ``trigger`` opens a call (a prefix of
    ``begin``); calls are joined by ``separator``."""

    name: str
    trigger: str
    begin: str
    middle: str
    end: str
    separator: str

    def render_call(self, name: str, arguments: str) -> str:
        """One call as the model writes it (``arguments``: JSON text)."""
        return f"{self.begin}{name}{self.middle}{arguments}{self.end}"

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """The fallback rendering's description of the tools (a template that cannot render them)."""
        lines = [json.dumps(t, ensure_ascii=False) for t in tools]
        example = self.render_call("<function-name>", "<arguments-json-object>")
        return (
            "You may call functions. The available functions, one JSON object per line:\n"
            + "\n".join(lines)
            + f"\nTo call a function, write:\n{example}"
        )


_TOOL_CALL = dict(trigger="<tool_call>", begin='<tool_call>\n{"name": "', middle='", "arguments": ')
FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", end="}\n</tool_call>", separator="\n", **_TOOL_CALL),
    "llada2": ToolFormat("llada2", end="}\n</tool_call>", separator="\n", **_TOOL_CALL),
}
DEFAULT_FORMAT = "hermes"


def format_named(name: str) -> ToolFormat:
    """The format ``--tool-call-parser NAME`` names; an unknown name is a one-line ConfigError."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool-call parser {name!r}; choose one of: {', '.join(sorted(FORMATS))}"
        ) from None


def detect_format(chat_template: Any) -> ToolFormat:
    """The format a chat template writes calls in: ``llada2`` for the LLaDA2.x / Ling roles
    (``<role>OBSERVATION</role>``), else ``hermes`` (Qwen's ``<tool_call>``, and the default)."""
    text = chat_template if isinstance(chat_template, str) else json.dumps(chat_template or "")
    if "<role>OBSERVATION</role>" in text or "OBSERVATION" in text and "<role>" in text:
        return FORMATS["llada2"]
    return FORMATS[DEFAULT_FORMAT]

"""Tool calls that always match their schema: an xgrammar structural tag over a model's call markup.

A tool-call constraint is an :class:`~.spec.OutputConstraint` of kind ``tool_calls`` whose source is
the canonical JSON of :func:`tool_calls_source`: the trigger that opens a call (``<tool_call>``), the
markup of one call (``begin`` + the function's name
+ ``middle`` + the arguments + ``end``, e.g. Qwen/Hermes' ``<tool_call>\\n{"name": "f", "arguments": ``
... ``}\\n</tool_call>``), the separator between calls, the functions (name and ``parameters`` schema)
and the mode:

- ``auto``: free text until the trigger (the begin tag) appears; from there the name is one of the
  functions and the arguments match that function's schema until the end tag, then free text again;
- ``required``: one or more calls (``parallel``) or exactly one, separated by the separator, nothing
  else (a named function is ``required`` over that one function).

- ``auto`` with an ``answer`` (a JSON schema's text: the request's ``response_format``): either calls as
  under ``required``, or a final answer matching that schema, nothing else (xgrammar's ``or``).

``parallel`` false stops the output after the first call. A ``think`` pair (a reasoning model's open and
close tags, set by :func:`with_think`) lets the output begin with one free-text block between them (the
model reasons first); the constraint holds from the block's end. The arguments' grammar is the one JSON
schemas get everywhere (:func:`.compiler.json_schema_grammar`: compact, no raw control characters).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError

MODES = ("auto", "required")


def tool_calls_source(
    *,
    trigger: str,
    begin: str,
    middle: str,
    end: str,
    separator: str,
    functions: Sequence[tuple[str, Any]],
    mode: str,
    parallel: bool,
    answer: str | None = None,
) -> str:
    """The constraint's source text (canonical JSON; equal requests share one compiled grammar);
    ``answer``: the final answer's JSON schema (text) that ``auto`` allows instead of calls."""
    if mode not in MODES:
        raise ConfigError(f"tool-call mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not functions:
        raise ConfigError("a tool-call constraint needs at least one function")
    if not begin.startswith(trigger):
        raise ConfigError("a tool call's begin text must start with its trigger")
    if answer is not None and mode != "auto":
        raise ConfigError("a final answer's schema applies under tool-call mode auto only")
    spec = {
        "trigger": trigger,
        "begin": begin,
        "middle": middle,
        "end": end,
        "separator": separator,
        "functions": [[name, schema] for name, schema in functions],
        "mode": mode,
        "parallel": bool(parallel),
    }
    if answer is not None:
        spec["answer"] = _schema(answer)
    return json.dumps(spec, separators=(",", ":"))


def with_answer(source: str, answer: str) -> str:
    """``source`` (mode ``auto``) allowing a final answer matching the JSON schema ``answer`` instead."""
    spec = json.loads(source)
    if spec["mode"] != "auto":
        raise ConfigError("a final answer's schema applies under tool-call mode auto only")
    spec["answer"] = _schema(answer)
    return json.dumps(spec, separators=(",", ":"))


def _schema(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if not isinstance(schema, (Mapping, bool)):
        raise ConfigError("a function's parameters must be a JSON schema object")
    return json.dumps(schema, separators=(",", ":"))


def with_think(source: str, open_tag: str, close_tag: str, after: str = "") -> str:
    """``source`` allowing one free-text block ``open_tag … close_tag`` (then exactly ``after``) before
    what it constrains."""
    spec = json.loads(source)
    spec["think"] = [open_tag, close_tag, after]
    return json.dumps(spec, separators=(",", ":"))


def _thinking_first(spec: dict[str, Any], fmt: dict[str, Any]) -> dict[str, Any]:
    """``fmt`` after an optional think block when ``spec`` has one."""
    if "think" not in spec:
        return fmt
    open_tag, close_tag, after = spec["think"]
    block: dict[str, Any] = {
        "type": "tag",
        "begin": open_tag,
        "content": {"type": "any_text"},
        "end": close_tag,
    }
    if after:
        block = {"type": "sequence", "elements": [block, {"type": "const_string", "value": after}]}
    return {"type": "sequence", "elements": [{"type": "optional", "content": block}, fmt]}


def structural_tag(source: str, arguments_grammar: Any) -> dict[str, Any]:
    """xgrammar's structural-tag description of ``source`` (:func:`tool_calls_source`);
    ``arguments_grammar(schema_text)`` gives the EBNF of one function's arguments."""
    spec = json.loads(source)
    tags = [
        {
            "type": "tag",
            "begin": spec["begin"] + name + spec["middle"],
            "content": {"type": "grammar", "grammar": arguments_grammar(_schema(schema))},
            "end": spec["end"],
        }
        for name, schema in spec["functions"]
    ]
    parallel = spec["parallel"]
    if "answer" in spec:
        calls = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": spec["separator"],
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
        answer = {"type": "grammar", "grammar": arguments_grammar(spec["answer"])}
        either = {"type": "or", "elements": [calls, answer]}
        return {"type": "structural_tag", "format": _thinking_first(spec, either)}
    if spec["mode"] == "auto":
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": [spec["trigger"]],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    else:
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": spec["separator"],
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    return {"type": "structural_tag", "format": _thinking_first(spec, fmt)}

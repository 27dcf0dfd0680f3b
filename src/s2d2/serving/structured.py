"""Structured output on the server: the OpenAI / vLLM request fields that constrain the output.

- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``, ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}}}``;
- vLLM's extras: ``structured_outputs`` (``{"json": ..., "regex": ..., "choice": [...], "grammar": ...}``)
  and the older top-level ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``;
- chat ``tools`` (:mod:`.tools.request`): under ``tool_choice`` auto, required or a named function the
  calls' names and arguments are constrained (a structural tag over the model's call markup).

At most one of them per request, except ``response_format`` (json_schema / json_object) with ``tools``:
under ``tool_choice`` auto one constraint lets the reply be either calls or a final answer matching the
format (:func:`s2d2.constraints.tool_calls.with_answer`); under required or a named function only calls
(the format is still checked). Each problem is a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..constraints import CompiledConstraint, OutputConstraint, constraint_of
from ..constraints.tool_calls import with_answer, with_think
from ..errors import S2D2Error
from .errors import bad_request
from .reasoning.parser import END_THINK, THINK
from .served_model import ServedModel

#: vLLM's ``structured_outputs`` keys, as :func:`s2d2.constraints.constraint_of` names them.
_VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


@dataclass
class Structured:
    """The request's constraint and its field (for errors)."""

    constraint: OutputConstraint | None
    param: str | None = None


def structured_of(body: Any, tools: OutputConstraint | None = None, forced: bool = False) -> Structured:
    """The request's structured-output constraint (see the module docstring); ``tools``: the tool calls'
    constraint (:class:`.tools.request.ToolPlan`), if any; a 400 on bad input. ``forced``: the reply
    only calls (tool_choice required or named), so a ``response_format`` (which shapes text) is checked
    and the calls' constraint applies; with tool_choice auto the reply is calls or an answer in the
    format."""
    given: list[tuple[str, str, Any]] = []  # (field, constraint_of keyword, value)
    rf = getattr(body, "response_format", None)
    if rf is not None and rf.type != "text":
        given.append(("response_format", "response_format", rf.model_dump()))
    for name, key in _GUIDED.items():
        if getattr(body, name, None) is not None:
            given.append((name, key, getattr(body, name)))
    so = getattr(body, "structured_outputs", None)
    for key, value in (so or {}).items():
        if key not in _VLLM_KEYS:
            raise bad_request(f"structured_outputs.{key} is not supported", param="structured_outputs")
        if value is not None:
            given.append((f"structured_outputs.{key}", _VLLM_KEYS[key], value))
    if tools is not None and [g[0] for g in given] == ["response_format"]:
        answer = structured_of(body).constraint  # the format is checked either way
        if not forced:
            schema = answer.source if answer.kind == "json_schema" else '{"type":"object"}'
            tools = OutputConstraint("tool_calls", with_answer(tools.source, schema))
        given = []
    if tools is not None:
        given.append(("tools", "tool_calls", tools))
    if len(given) > 1:
        names = ", ".join(g[0] for g in given)
        raise bad_request(f"give at most one output constraint, got {names}", param=given[1][0])
    if not given:
        return Structured(None)
    param, key, value = given[0]
    if key == "tool_calls":
        return Structured(value, param)
    try:
        constraint = constraint_of(**{key: value})
    except S2D2Error as exc:
        raise bad_request(str(exc), param=param, code="invalid_value") from None
    return Structured(constraint, param)


def thinking_first(structured: Structured, reasoning: str | None, body: Any) -> Structured:
    """With a reasoning parser and thinking on (``chat_template_kwargs.enable_thinking`` not false), a
    tool-call constraint that binds from the first token (required, named, or calls-or-answer) first
    lets the model write its think block (``<think>`` … ``</think>`` and Qwen3's blank line); tool_choice
    auto leaves text before a call free anyway. Other constraints are unchanged."""
    c = structured.constraint
    kwargs = getattr(body, "chat_template_kwargs", None) or {}
    if reasoning is None or kwargs.get("enable_thinking") is False or c is None or c.kind != "tool_calls":
        return structured
    spec = json.loads(c.source)
    if spec["mode"] == "auto" and "answer" not in spec:
        return structured
    return Structured(
        OutputConstraint(c.kind, with_think(c.source, THINK, END_THINK, "\n\n")), structured.param
    )


def compile_for(model: ServedModel, structured: Structured) -> CompiledConstraint | None:
    """The compiled constraint for ``model`` (cached there); an invalid one is a 400 naming the field."""
    try:
        return model.compile_constraint(structured.constraint)
    except S2D2Error as exc:
        raise bad_request(str(exc), param=structured.param, code="invalid_value") from None


def check_settings(structured: Structured, config: Any, given: dict[str, str]) -> None:
    """A setting structured output cannot honour is a 400 naming that setting's field: the top-level
    field that set it (``given``: setting -> field), else its ``s2d2`` setting."""
    if structured.constraint is None:
        return
    for name, bad, why in (
        ("ignore_eos", config.ignore_eos, "structured output ends where its grammar does"),
        ("editing_threshold", config.editing_threshold is not None, "token editing rewrites tokens"),
    ):
        if bad:
            raise bad_request(
                f"{name} cannot be combined with {structured.param} ({why})",
                param=given.get(name, f"s2d2.{name}"),
                code="invalid_value",
            )

"""Structured output on the server: the OpenAI / vLLM request fields that constrain the output.

- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``, ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}}}``;
- vLLM's extras: ``structured_outputs`` (``{"json": ..., "regex": ..., "choice": [...], "grammar": ...}``)
  and the older top-level ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``;
- chat ``tools`` with ``tool_choice`` naming a function (``{"type": "function", "function": {"name": N}}``):
  the answer is a call of N whose arguments match its ``parameters`` schema. ``tool_choice`` ``auto`` /
  ``required`` would need the model's own tool-call format, so they are a 400; ``none`` (or no
  ``tool_choice``) decodes plain text.

At most one of them per request; each problem is a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..constraints import OutputConstraint, constraint_of
from ..errors import S2D2Error
from .errors import APIError, bad_request

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
    """The request's constraint, its field (for errors) and, for a forced tool call, the function."""

    constraint: OutputConstraint | None
    param: str | None = None
    tool_name: str | None = None


def _forced_tool(body: Any) -> tuple[str, Any] | None:
    """``(name, parameters schema)`` of the function ``tool_choice`` names; None: no tool call."""
    tools, choice = getattr(body, "tools", None), getattr(body, "tool_choice", None)
    for name in ("functions", "function_call"):
        if getattr(body, name, None) not in (None, "none", []):
            raise bad_request(f"{name} is not supported: use tools with a named tool_choice", param=name)
    if choice is None and tools:
        raise bad_request(
            "tools need a tool_choice naming a function (tool_choice auto is not supported)", param="tools"
        )
    if choice in (None, "none"):
        return None
    if choice in ("auto", "required"):
        raise bad_request(
            f"tool_choice {choice!r} is not supported: name a function "
            '({"type": "function", "function": {"name": ...}}), whose arguments are then constrained',
            param="tool_choice",
            code="unsupported_value",
        )
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise bad_request("tool_choice must name a function", param="tool_choice", code="invalid_value")
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            return name, fn.get("parameters") or {"type": "object"}
    raise bad_request(f"tool_choice names {name!r}, which tools do not define", param="tool_choice")


def structured_of(body: Any) -> Structured:
    """The request's structured-output constraint (see the module docstring); a 400 on bad input."""
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
    tool = _forced_tool(body)
    if tool is not None:
        given.append(("tool_choice", "json_schema", tool[1]))
    if len(given) > 1:
        names = ", ".join(g[0] for g in given)
        raise bad_request(f"give at most one output constraint, got {names}", param=given[1][0])
    if not given:
        return Structured(None)
    param, key, value = given[0]
    try:
        constraint = constraint_of(**{key: value})
    except S2D2Error as exc:
        raise bad_request(str(exc), param=param, code="invalid_value") from None
    return Structured(constraint, param, tool[0] if tool is not None else None)


def compile_for(model: Any, structured: Structured) -> Any:
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


def check_stream(structured: Structured, stream: bool) -> None:
    if structured.tool_name is not None and stream:
        raise APIError(
            400,
            "a forced tool call is answered whole: stream must be false",
            param="stream",
            code="unsupported_value",
        )


def tool_call_message(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """A chat message calling function ``name`` with ``arguments`` (JSON text, constrained to its schema)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}

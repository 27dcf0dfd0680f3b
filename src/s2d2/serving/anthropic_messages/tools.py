"""A Messages request's ``tools`` and ``tool_choice`` as the chat request's ``tools``, ``tool_choice`` and
``parallel_tool_calls``.

A client tool (``{"name", "description", "input_schema", "type": "custom"}``, ``strict`` and
``cache_control`` accepted) becomes a function tool whose ``parameters`` are its ``input_schema``.
Anthropic's server tools (web search, code execution, bash, text editor, ...: any other ``type``) are a
400 naming the entry. ``tool_choice``: ``auto`` -> ``auto``, ``any`` -> ``required``, ``tool`` (with
``name``) -> that function, ``none`` -> ``none``; ``disable_parallel_tool_use: true`` sets
``parallel_tool_calls`` false (default: parallel calls allowed, as Anthropic's).
"""

from __future__ import annotations

from typing import Any

from ..errors import bad_request
from .checks import check_object, required_str, unsupported

TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict"}
#: tool_choice type -> (the chat tool_choice, its known keys)
CHOICES: dict[str, tuple[str, set[str]]] = {
    "auto": ("auto", {"type", "disable_parallel_tool_use"}),
    "any": ("required", {"type", "disable_parallel_tool_use"}),
    "tool": ("named", {"type", "name", "disable_parallel_tool_use"}),
    "none": ("none", {"type"}),
}


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """The function tools of ``tools`` (None stays None)."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise unsupported(f"{where}.type", f"the server tool {kind!r} (client tools only)")
        check_object(tool, TOOL_KEYS, where)
        fn: dict[str, Any] = {"name": required_str(tool, "name", where)}
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(
                f"{where}.input_schema: must be a JSON schema object",
                param=f"{where}.input_schema",
                code="invalid_value",
            )
        fn["parameters"] = schema
        if "description" in tool:
            fn["description"] = required_str(tool, "description", where)
        if "strict" in tool:
            fn["strict"] = tool["strict"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """``(tool_choice, parallel_tool_calls)`` of the chat request (None: the chat defaults)."""
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in CHOICES:
        raise bad_request(
            "tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'",
            param="tool_choice.type",
            code="invalid_value",
        )
    mode, known = CHOICES[kind]
    check_object(choice, known, "tool_choice")
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise bad_request(
            "tool_choice.disable_parallel_tool_use: must be a boolean",
            param="tool_choice.disable_parallel_tool_use",
        )
    parallel = False if disable else None
    if mode == "named":
        name = required_str(choice, "name", "tool_choice")
        return {"type": "function", "function": {"name": name}}, parallel
    return mode, parallel

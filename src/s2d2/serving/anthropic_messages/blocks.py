"""A Messages request's ``system`` and ``messages`` as chat messages (OpenAI's shape, for the chat path).

- ``system``: a string or a list of ``text`` blocks: one system message first.
- A ``user`` turn: its ``text`` blocks become user messages and each ``tool_result`` block a ``tool``
  message (``tool_call_id`` = its ``tool_use_id``, ``name`` = the tool the call named; ``content`` a
  string or ``text`` blocks), in the order they come. A result must answer a ``tool_use`` of an earlier
  assistant turn.
- An ``assistant`` turn: its text (the ``text`` blocks joined) and one call per ``tool_use`` block
  (``arguments`` = its ``input`` as JSON text); its ``thinking`` blocks' text is the message's
  ``reasoning_content`` (the chat template decides whether to render it, as for chat); a
  ``redacted_thinking`` block is dropped.
- ``cache_control`` is accepted wherever Anthropic takes it and has no effect (the prefix cache needs no
  marks). ``citations`` must be null. Images, documents and other block types are a 400 naming the block,
  as is a last turn by the assistant (a prefill: the chat path always starts a new assistant turn) and
  any unknown key (by its path).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import bad_request
from .checks import check_object, required_str, unsupported

TEXT_KEYS = {"type", "text", "cache_control", "citations"}
TOOL_USE_KEYS = {"type", "id", "name", "input", "cache_control"}
TOOL_RESULT_KEYS = {"type", "tool_use_id", "content", "is_error", "cache_control"}
THINKING_KEYS = {"type", "thinking", "signature"}
REDACTED_KEYS = {"type", "data"}
MESSAGE_KEYS = {"role", "content"}


def text_of_block(block: Any, where: str) -> str:
    """A ``text`` block's text (a 400 naming the path for any other block or key)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind != "text":
        if isinstance(kind, str):
            raise unsupported(f"{where}.type", f"a {kind!r} block here")
        raise bad_request(f"{where}: must be a text block", param=where, code="invalid_value")
    check_object(block, TEXT_KEYS, where)
    if block.get("citations") not in (None, []):
        raise unsupported(f"{where}.citations", "citations")
    return required_str(block, "text", where)


def text_of(content: Any, where: str) -> str:
    """A string, or a list of ``text`` blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: must be a string or a list of text blocks", param=where)
    return "".join(text_of_block(b, f"{where}.{j}") for j, b in enumerate(content))


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    check_object(block, TOOL_USE_KEYS, where)
    call_id, name = required_str(block, "id", where), required_str(block, "name", where)
    args = block.get("input")
    if not isinstance(args, dict):
        raise bad_request(f"{where}.input: must be an object", param=f"{where}.input", code="invalid_value")
    fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
    return {"id": call_id, "type": "function", "function": fn}


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    text, thought, calls = "", "", []
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind == "thinking":
            check_object(block, THINKING_KEYS, at)
            thought += required_str(block, "thinking", at)
        elif kind == "redacted_thinking":
            check_object(block, REDACTED_KEYS, at)
        else:
            text += text_of_block(block, at)
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if thought:
        message["reasoning_content"] = thought
    return message


def _tool_result(block: dict[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    check_object(block, TOOL_RESULT_KEYS, where)
    call_id = required_str(block, "tool_use_id", where)
    if call_id not in names:
        raise bad_request(
            f"{where}.tool_use_id: {call_id!r} answers no tool_use block of an earlier assistant turn",
            param=f"{where}.tool_use_id",
            code="invalid_value",
        )
    if not isinstance(block.get("is_error", False), bool):
        raise bad_request(f"{where}.is_error: must be a boolean", param=f"{where}.is_error")
    text = text_of(block.get("content", ""), f"{where}.content")
    return {"role": "tool", "tool_call_id": call_id, "name": names[call_id], "content": text}


def _user(blocks: list[Any], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text: str | None = None
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if text is not None:
                out.append({"role": "user", "content": text})
                text = None
            out.append(_tool_result(block, at, names))
        else:
            text = (text or "") + text_of_block(block, at)
    if text is not None or not out:
        out.append({"role": "user", "content": text or ""})
    return out


def chat_messages(system: Any, messages: list[Any]) -> list[dict[str, Any]]:
    """The chat messages of ``system`` and ``messages`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = text_of(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        check_object(m, MESSAGE_KEYS, where)
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}.role: must be 'user' or 'assistant'", param=f"{where}.role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(
                f"{where}.content: must be a string or a list of content blocks", param=f"{where}.content"
            )
        if role == "assistant":
            message = _assistant(content, f"{where}.content")
            names.update({c["id"]: c["function"]["name"] for c in message.get("tool_calls", [])})
            out.append(message)
        else:
            out += _user(content, f"{where}.content", names)
    if messages and messages[-1].get("role") == "assistant":
        where = f"messages.{len(messages) - 1}"
        raise unsupported(where, "a last assistant turn to continue (prefill)")
    return out

"""Conversations with tools to prompt text: the model's chat template, or the documented fallback.

The chat template receives the messages as transformers' ``apply_chat_template`` takes them: an
assistant turn's ``tool_calls`` (each ``{"id", "type": "function", "function": {"name", "arguments"}}``,
the arguments as a JSON object where the text parses, as templates expect), a tool turn's
``tool_call_id`` and ``name``; and ``tools=`` (the request's tool entries). A template that renders the
same text with and without the tools cannot render them: the server then adds the tools' description
and how to call them (:meth:`ToolFormat.instructions`) as a system turn at the start (into the first
system turn when there is one). A tokenizer without a template uses the server's fallback
(:mod:`s2d2.serving.chat`), with the same system turn and each earlier call written in the format's
markup. Every history message is checked first: a ``tool`` turn needs its ``tool_call_id``, an assistant
turn's calls need a name and arguments (a 400 naming the field).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import bad_request
from .formats import ToolFormat


def check_messages(messages: Sequence[Any]) -> None:
    """A 400 naming the field for a tool turn without ``tool_call_id`` or a malformed earlier call."""
    for i, m in enumerate(messages):
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(
                "a tool message needs the tool_call_id of the call it answers",
                param=f"messages.{i}.tool_call_id",
            )
        for j, call in enumerate(m.tool_calls or []):
            where = f"messages.{i}.tool_calls.{j}"
            if m.role != "assistant":
                raise bad_request(
                    "only assistant messages carry tool_calls", param=f"messages.{i}.tool_calls"
                )
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request(f"{where} needs function.name", param=f"{where}.function.name")
            if not isinstance(fn.get("arguments", ""), str):
                raise bad_request(
                    f"{where}.function.arguments must be a JSON string", param=f"{where}.function.arguments"
                )


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def template_message(m: Any) -> dict[str, Any]:
    """One message as a chat template reads it."""
    out: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _arguments(c["function"].get("arguments")),
                },
            }
            for c in m.tool_calls
        ]
    thought = (getattr(m, "model_extra", None) or {}).get("reasoning_content")
    if isinstance(thought, str):  # an earlier reply's reasoning (Qwen3-style templates re-render it)
        out["reasoning_content"] = thought
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def with_instructions(conv: list[dict[str, Any]], fmt: ToolFormat, tools: list[dict]) -> list[dict[str, Any]]:
    """``conv`` with the tools' description as (or in) its first system turn."""
    text = fmt.instructions(tools)
    if conv and conv[0]["role"] == "system":
        return [{**conv[0], "content": f"{conv[0]['content']}\n\n{text}"}, *conv[1:]]
    return [{"role": "system", "content": text}, *conv]


def fallback_text(m: Any, fmt: ToolFormat | None) -> str:
    """A message's text for the server's fallback template: an assistant turn's calls in the format's
    markup after its text."""
    text = m.text()
    if not m.tool_calls or fmt is None:
        return text
    calls = [
        fmt.render_call(c["function"]["name"], c["function"].get("arguments") or "{}") for c in m.tool_calls
    ]
    return fmt.separator.join([t for t in [text] if t] + calls)


def apply_template(
    tok: Any,
    conv: list[dict[str, Any]],
    tools: list[dict] | None,
    fmt: ToolFormat | None,
    extra: dict[str, Any] | None = None,
) -> Any:
    """``apply_chat_template`` with ``tools`` (the fallback instructions where it ignores them) and the
    template's ``extra`` variables (``chat_template_kwargs``); a template that fails on the conversation
    (one that raises on a role it does not know, say) is a 400. The message quotes what the template
    itself raised (``raise_exception``), never a Python or jinja error; with ``extra`` given it names
    ``chat_template_kwargs``, the likelier cause."""
    try:
        return _apply(tok, conv, tools, fmt, extra or {})
    except Exception as exc:  # jinja2's TemplateError and what a template raises itself
        said = str(exc).splitlines()[0] if type(exc).__name__ == "TemplateError" and str(exc) else ""
        why = f": {said[:200]}" if said else ""
        if extra:
            raise bad_request(
                f"the model's chat template cannot render this conversation with these "
                f"chat_template_kwargs ({', '.join(sorted(extra))[:120]}){why}",
                param="chat_template_kwargs",
            ) from None
        message = f"the model's chat template cannot render this conversation{why}"
        raise bad_request(message, param="messages") from None


def _apply(
    tok: Any,
    conv: list[dict[str, Any]],
    tools: list[dict] | None,
    fmt: ToolFormat | None,
    extra: dict[str, Any],
) -> Any:
    if not tools or fmt is None:
        return tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, **extra)
    with_tools = tok.apply_chat_template(
        conv, tools=tools, add_generation_prompt=True, tokenize=False, **extra
    )
    plain = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False, **extra)
    if with_tools == plain:
        conv = with_instructions(conv, fmt, tools)
        return tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, **extra)
    return tok.apply_chat_template(conv, tools=tools, add_generation_prompt=True, tokenize=True, **extra)

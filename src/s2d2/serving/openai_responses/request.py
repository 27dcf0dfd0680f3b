"""``POST /v1/responses``: OpenAI's Responses request, checked and translated into a chat request.

Supported: ``input`` (a string, or a list of message items, ``function_call`` and
``function_call_output`` items, and ``reasoning`` items sent back: their text becomes the next assistant
turn's ``reasoning_content``), ``instructions`` (a system turn first), function ``tools`` (the flat
Responses shape: ``{"type": "function", "name", "description", "parameters", "strict"}``) with
``tool_choice`` (``auto`` / ``required`` / ``none`` / ``{"type": "function", "name": N}``) and
``parallel_tool_calls``, ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, ``text.format``
(``text``, ``json_object``, ``json_schema`` with ``name`` and ``schema``), the ``s2d2`` settings object,
and the caller-only ``user`` / ``metadata`` / ``truncation: "disabled"`` / ``include: []``. The server
keeps no responses: ``store: true`` and ``previous_response_id`` (and ``conversation``) are a 400, as is
every other field the server does not implement (by its name). Unknown keys at any depth of ``input``
items, ``text`` / ``text.format`` and ``tool_choice`` are a 400 naming their path (the chat checks'
rule, :func:`..openai_fields.unknown_keys`). The translated chat request goes through the same checks,
rendering and tool-call constraint as ``/v1/chat/completions``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import bad_request, unknown_arguments
from ..openai_fields import Shape, keys, unknown_keys
from ..protocol import ChatCompletionRequest, S2D2Settings
from ..translated import chat_request

_CLOSED: dict[str, Any] = {"additionalProperties": False}
#: Fields refused with their reason (the server keeps no responses).
_NOT_KEPT = ("previous_response_id", "conversation")
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PART = keys(("type", "text", "annotations", "logprobs"))
#: What each kind of ``input`` item may hold (OpenAI's documented keys).
INPUT_SHAPES: dict[str, Shape] = {
    "message": keys(("type", "role", "id", "status"), content=_TEXT_PART),
    "function_call": keys(("type", "id", "call_id", "name", "arguments", "status")),
    "function_call_output": keys(("type", "id", "call_id", "status"), output=_TEXT_PART),
    "reasoning": keys(("type", "id", "encrypted_content", "status"), summary=_TEXT_PART, content=_TEXT_PART),
}
FORMAT_SHAPES: dict[str, Shape] = {
    "json_schema": keys(("type", "name", "schema", "description", "strict")),
    "json_object": keys(("type",)),
    "text": keys(("type",)),
}


def unknown_paths(body: ResponsesRequest) -> list[str]:
    """Paths of unknown keys in ``input`` items, ``text`` (and its ``format``) and ``tool_choice``."""
    out: list[str] = []
    for i, item in enumerate(body.input if isinstance(body.input, list) else []):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind in INPUT_SHAPES:  # (an unknown type is refused by name when the input is read)
            out += unknown_keys(item, INPUT_SHAPES[kind], f"input.{i}")
    fmt = (body.text or {}).get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    shape = keys(("verbosity",), format=FORMAT_SHAPES.get(kind)) if kind in FORMAT_SHAPES else None
    out += unknown_keys(body.text, shape or keys(("format", "verbosity")), "text")
    out += unknown_keys(body.tool_choice, keys(("type", "name")), "tool_choice")
    return out


class ResponsesRequest(BaseModel):
    """POST /v1/responses (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, json_schema_extra=_CLOSED)

    model: str | None = Field(None, description="The served model's name; optional.")
    input: str | list[Any] = Field(description="Text, or a list of message / function_call(_output) items.")
    instructions: str | None = Field(None, description="A system message before the input.")
    tools: list[Any] | None = Field(None, description="Function tools (flat Responses shape).")
    tool_choice: Any = Field(
        None, description='`auto`, `required`, `none` or {"type": "function", "name": N}.'
    )
    parallel_tool_calls: bool | None = Field(None, description="Several calls in one reply (default true).")
    max_output_tokens: int | None = Field(None, ge=1, description="Most tokens to generate.")
    temperature: float | None = Field(None, ge=0, description="0 = greedy.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus filter, in (0, 1].")
    stream: bool | None = Field(None, description="Stream the Responses server-sent events.")
    text: dict[str, Any] | None = Field(None, description='`{"format": {"type": "json_schema", ...}}`.')
    store: bool | None = Field(None, description="Only false: the server keeps no responses.")
    previous_response_id: str | None = Field(None, description="Not supported (no responses are kept).")
    conversation: Any = Field(None, description="Not supported (no responses are kept).")
    truncation: str | None = Field(None, description='Only "disabled".')
    include: list[str] | None = Field(None, description="Only empty: no extra output data is offered.")
    user: str | None = Field(None, description="Describes the caller; no effect.")
    metadata: dict[str, str] | None = Field(None, description="Describes the caller; no effect.")
    s2d2: S2D2Settings | None = Field(None, description="Per-request decoding settings (extension).")  # type: ignore[valid-type]


def _refused(body: ResponsesRequest) -> None:
    extra = list(body.model_extra or {})
    if extra:
        raise bad_request(f"{extra[0]} is not supported", param=extra[0], code="unsupported_parameter")
    unknown = unknown_paths(body)
    if unknown:
        raise unknown_arguments(unknown)
    if body.store:
        raise bad_request(
            "store=true is not supported: the server keeps no responses (send store=false or leave it out)",
            param="store",
            code="unsupported_value",
        )
    for name in _NOT_KEPT:
        if getattr(body, name) is not None:
            raise bad_request(
                f"{name} is not supported: the server keeps no responses (send the whole input)",
                param=name,
                code="unsupported_parameter",
            )
    if body.include:
        raise bad_request(
            f"include {body.include[0]!r} is not supported", param="include", code="unsupported_value"
        )
    if body.truncation not in (None, "disabled"):
        raise bad_request('truncation must be "disabled"', param="truncation", code="unsupported_value")


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts", param=where)
    parts = []
    for j, part in enumerate(content):
        kinds = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
        if not isinstance(part, dict) or part.get("type") not in kinds:
            raise bad_request(
                f"{where}.{j} must be a text part (input_text / output_text)",
                param=f"{where}.{j}",
                code="unsupported_value",
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of ``instructions`` and ``input``: consecutive function calls join one
    assistant turn (the one before them when it has no calls yet)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    thought: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = _text_of(item.get("content") or [], f"{where}.content")
            continue
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}", param=f"{where}.role")
            out.append(
                {"role": item["role"], "content": _text_of(item.get("content", ""), f"{where}.content")}
            )
            if item["role"] == "assistant" and thought is not None:
                out[-1]["reasoning_content"], thought = thought, None
        elif kind == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out else None
            if (
                last is None
                or last["role"] != "assistant"
                or last.get("tool_calls") is None
                and last["content"]
            ):
                last = {"role": "assistant", "content": None, "tool_calls": []}
                out.append(last)
            if thought is not None:
                last["reasoning_content"], thought = thought, None
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where} needs its call_id", param=f"{where}.call_id")
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise bad_request(f"{where} of type {kind!r} is not supported", param=f"{where}.type")
    return out


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"{where} needs {key} (a string)", param=f"{where}.{key}")
    fn = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": fn}


def _tools(tools: list[Any] | None) -> list[Any] | None:
    """Flat Responses function tools as chat tools (other entries are left for the chat checks)."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") == "function" and "function" not in t:
            fn = {k: v for k, v in t.items() if k != "type"}
            out.append({"type": "function", "function": fn})
        elif isinstance(t, dict) and t.get("type") not in (None, "function"):
            raise bad_request(
                f"tools.{i} of type {t.get('type')!r} is not supported (function tools only)",
                param=f"tools.{i}.type",
                code="unsupported_value",
            )
        else:
            out.append(t)
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("text.format type must be text, json_object or json_schema", param="text.format")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": spec}


def to_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers ``body`` (a 400 naming the Responses field on bad input)."""
    _refused(body)
    chat: dict[str, Any] = {"messages": _messages(body), "model": body.model, "stream": body.stream}
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        chat[name] = getattr(body, name)
    chat["max_tokens"] = body.max_output_tokens
    chat["tools"] = _tools(body.tools)
    chat["tool_choice"] = _tool_choice(body.tool_choice)
    chat["response_format"] = _response_format(body.text)
    return chat_request(chat, body.s2d2, "input")

"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's request, checked and translated into
a chat completions request.

Supported: ``model`` (the served name, as every endpoint), ``messages`` and ``system``
(:mod:`.blocks`), ``tools`` and ``tool_choice`` (:mod:`.tools`), ``max_tokens``, ``stop_sequences``,
``temperature``, ``top_p``, ``top_k``, ``stream``, ``output_config.format`` (``json_schema``: the reply's
text follows the schema, as chat's ``response_format``), ``thinking`` (``enabled`` / ``adaptive`` /
``disabled`` set the chat template's ``enable_thinking`` variable, which Qwen3-style templates read; the
reasoning comes back as a ``thinking`` block where the server has a reasoning parser), the ``s2d2``
settings object, and with no effect ``metadata`` and ``service_tier``. Anthropic's other documented
fields (:data:`UNSUPPORTED`) are a 400 saying they are not supported; any other field is a 400 naming
it. The translated chat request goes through the same checks, rendering and tool-call constraint as
``/v1/chat/completions``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import bad_request
from ..protocol import ChatCompletionRequest, S2D2Settings
from ..translated import chat_request
from .blocks import chat_messages
from .checks import check_object, unsupported
from .tools import chat_tool_choice, chat_tools

_CLOSED: dict[str, Any] = {"additionalProperties": False}
#: Anthropic's documented request fields this server does not implement.
UNSUPPORTED = (
    "container", "mcp_servers", "context_management", "cache_control", "inference_geo", "speed",
    "diagnostics", "user_profile_id", "workspace_id",
)  # fmt: skip
THINKING_TYPES = {"enabled": {"type", "budget_tokens", "display"}, "disabled": {"type"}}
THINKING_TYPES["adaptive"] = {"type", "display"}


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, json_schema_extra=_CLOSED)

    model: str = Field(description="The served model's name.")
    messages: list[Any] = Field(min_length=1, description="The conversation: user and assistant turns.")
    system: str | list[Any] | None = Field(None, description="A system prompt: text or text blocks.")
    tools: list[Any] | None = Field(None, description="Client tools: name, description, input_schema.")
    tool_choice: dict[str, Any] | None = Field(None, description="`auto`, `any`, `tool` (with name), `none`.")
    thinking: dict[str, Any] | None = Field(
        None, description="`enabled` / `adaptive` / `disabled`: the template's `enable_thinking`."
    )
    output_config: dict[str, Any] | None = Field(
        None, description='`{"format": {"type": "json_schema", ...}}`.'
    )
    s2d2: S2D2Settings | None = Field(None, description="Per-request decoding settings (extension).")  # type: ignore[valid-type]


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages (see the module docstring)."""

    max_tokens: int = Field(ge=1, description="Most tokens to generate.")
    stop_sequences: list[str] | None = Field(None, description="Strings that end the text (up to 4).")
    stream: bool | None = Field(None, description="Stream Anthropic's server-sent events.")
    temperature: float | None = Field(None, ge=0, description="0 = greedy (default: the model's).")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus filter, in (0, 1].")
    top_k: int | None = Field(None, ge=0, description="Only the k most likely tokens (0: off).")
    metadata: dict[str, Any] | None = Field(None, description="Describes the caller; no effect.")
    service_tier: str | None = Field(None, description="Accepted; no effect.")


def _refused(body: CountTokensRequest) -> None:
    for name in body.model_extra or {}:
        if name in UNSUPPORTED:
            raise unsupported(name, name)
        raise bad_request(f"{name}: Extra inputs are not permitted", param=name, code="unknown_parameter")
    if body.thinking is not None:
        kind = body.thinking.get("type")
        if kind not in THINKING_TYPES:
            raise bad_request("thinking.type: must be enabled, disabled or adaptive", param="thinking.type")
        check_object(body.thinking, THINKING_TYPES[kind], "thinking")
    if isinstance(body, MessagesRequest) and body.metadata is not None:
        check_object(body.metadata, {"user_id"}, "metadata")


def _response_format(config: dict[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    check_object(config, {"format"}, "output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    check_object(fmt, {"type", "schema"}, "output_config.format")
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad_request(
            "output_config.format: must be {'type': 'json_schema', 'schema': {...}}",
            param="output_config.format",
            code="invalid_value",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def to_chat(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that answers ``body`` (a 400 naming the Messages field on bad input)."""
    _refused(body)
    tool_choice, parallel = chat_tool_choice(body.tool_choice)
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": chat_messages(body.system, body.messages),
        "tools": chat_tools(body.tools),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "response_format": _response_format(body.output_config),
    }
    if isinstance(body, MessagesRequest):
        chat.update(max_tokens=body.max_tokens, stop=body.stop_sequences, stream=body.stream)
        chat.update(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    if body.thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": body.thinking["type"] != "disabled"}
    return chat_request(chat, body.s2d2, "messages")

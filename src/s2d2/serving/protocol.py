"""The OpenAI-compatible wire format: request and response bodies as pydantic models.

Requests are validated strictly (a string where a number belongs is a 400, not a silent conversion).
A top-level field the request models do not declare, and a ``stream_options`` key they do not declare,
is a 400 naming it, as OpenAI's own API answers (:func:`unknown_fields`; vLLM's extras that the server
honours are declared fields like any other). The fields that only
describe the caller (:data:`CALLER_FIELDS`) are accepted and have no effect. The ``s2d2`` extension
object's fields are exactly the decoding settings of :class:`s2d2.config.DecodeConfig` (plus
``preset``), so the OpenAPI schema describes each of them.
Value checks that need the model (decoder names, presets, ranges of decoding settings) are left to
``S2D2Model.make_config``, the same code the CLI uses.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..config import DecodeConfig
from .openai_fields import OpenAIExtras, unknown_nested

#: Decoding settings the ``s2d2`` object does not take (the server streams text, not step traces).
_HIDDEN_SETTINGS = {"trace"}
#: Settings whose JSON form differs from the dataclass's type (JSON object keys are strings; JSON arrays
#: arrive as lists, which the strict model does not take for a tuple field).
_WIRE_TYPES: dict[str, Any] = {"logit_bias": dict[str, float], "plan_block_sizes": list[int]}


def _settings_model() -> type[BaseModel]:
    """``S2D2Settings``: every field of :class:`DecodeConfig`, optional, plus ``preset``."""
    hints = typing.get_type_hints(DecodeConfig)
    fields: dict[str, Any] = {
        "preset": (
            str | None,
            Field(None, description="A named preset (see `s2d2 generate --help`); never a file path."),
        )
    }
    for f in dataclasses.fields(DecodeConfig):
        if f.name in _HIDDEN_SETTINGS:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        desc = f"Decoding setting `{f.name}` (as `s2d2 generate`; default {default!r})."
        fields[f.name] = (_WIRE_TYPES.get(f.name, hints[f.name]) | None, Field(None, description=desc))
    return create_model(
        "S2D2Settings",
        __config__=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False),
        __doc__="Per-request decoding settings (the s2d2 extension object); unset fields keep the defaults.",
        **fields,
    )


S2D2Settings = _settings_model()


#: OpenAI fields that only describe the caller (for the caller's own records): accepted, no effect here.
CALLER_FIELDS = ("user", "metadata", "store", "service_tier")
#: The schema of a model that keeps its extra fields only to refuse them: no other field is accepted.
_CLOSED: dict[str, Any] = {"additionalProperties": False}
_NO_EFFECT = "Accepted for OpenAI compatibility; it only describes the caller and has no effect."


class StreamOptions(BaseModel):
    # extra keys are kept to be refused by name (unknown_fields), not silently dropped
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, json_schema_extra=_CLOSED)
    include_usage: bool | None = Field(None, description="Send a last chunk with the usage.")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    type: str = Field(description="`text`, `json_object` or `json_schema` (with `json_schema`).")


class _Sampling(OpenAIExtras):
    """Fields both endpoints share."""

    # extra fields are kept to be refused by name (unknown_fields), not silently dropped
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, json_schema_extra=_CLOSED)

    model: str | None = Field(None, description="The served model's name (GET /v1/models); optional.")
    max_tokens: int | None = Field(
        None,
        ge=0,
        description="Most tokens to generate (default: the model's decoding default); a prompt plus "
        "max_tokens beyond the model's context is a 400. 0 only on /v1/completions with `echo`: the "
        "request then only scores the prompt.",
    )
    temperature: float | None = Field(None, ge=0, description="0 = greedy (default: the model's default).")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus filter, in (0, 1].")
    top_k: int | None = Field(None, ge=-1, description="Keep the k most likely tokens; 0 or -1 = off (vLLM).")
    seed: int | None = Field(
        None,
        ge=-(2**63),
        le=2**64 - 1,
        description="Seed of the request's own random generator; choice i of `n` uses seed + i.",
    )
    stop: str | list[str] | None = Field(
        None, description="Up to 4 stop strings; the text stops before the first one (not returned)."
    )
    stop_token_ids: list[int] | None = Field(None, description="Token ids that also end the text (vLLM).")
    ignore_eos: bool | None = Field(None, description="Keep generating past EOS (vLLM).")
    min_tokens: int | None = Field(None, ge=0, description="No EOS / stop token before this many (vLLM).")
    presence_penalty: float | None = Field(
        None, description="In [-2, 2]: subtracted from a token's logit once it was generated."
    )
    frequency_penalty: float | None = Field(
        None, description="In [-2, 2]: subtracted from a token's logit per time it was generated."
    )
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100] added to its logit."
    )
    n: int | None = Field(None, ge=1, description="Choices per prompt (each its own engine request).")
    stream: bool | None = Field(None, description="Stream server-sent events, ending in `data: [DONE]`.")
    stream_options: StreamOptions | None = Field(None, description="Only with `stream`.")
    response_format: ResponseFormat | None = Field(
        None, description='`{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", ...}`.'
    )
    tools: list[Any] | None = Field(None, description="Function tools the model may call (chat).")
    tool_choice: Any = Field(
        None,
        description="`auto` (default with tools), `required`, `none`, or a named function; calls' arguments "
        "always match the tool's schema.",
    )
    parallel_tool_calls: bool | None = Field(
        None, description="Several calls in one reply (default true); false: at most one."
    )
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's: one of `json` (a schema), `regex`, `choice` (strings), `grammar` (EBNF)."
    )
    guided_json: Any = Field(None, description="vLLM's older name of `structured_outputs.json`.")
    guided_regex: str | None = Field(None, description="vLLM's older name of `structured_outputs.regex`.")
    guided_choice: list[str] | None = Field(None, description="vLLM's older `structured_outputs.choice`.")
    guided_grammar: str | None = Field(None, description="vLLM's older `structured_outputs.grammar`.")
    functions: list[Any] | None = Field(None, description="Deprecated: use `tools` (a 400 unless empty).")
    function_call: Any = Field(None, description="Deprecated: use `tool_choice` (a 400 unless `none`).")
    user: str | None = Field(None, description=_NO_EFFECT)
    metadata: dict[str, str] | None = Field(None, description=_NO_EFFECT)
    store: bool | None = Field(None, description=_NO_EFFECT)
    service_tier: str | None = Field(None, description=_NO_EFFECT)
    s2d2: S2D2Settings | None = Field(None, description="Per-request decoding settings (extension).")  # type: ignore[valid-type]


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="The prompt: text, token ids, or a list of either (one choice set per prompt)."
    )
    echo: bool | None = Field(None, description="Return the prompt before the completion.")
    logprobs: int | None = Field(
        None, ge=0, le=20, description="Report token logprobs and this many most likely alternatives."
    )
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="vLLM's extra: each choice gets `prompt_logprobs`, per prompt token its exact AR-mode "
        "logprob and this many alternatives (the first token null). Not with `stream`.",
    )
    best_of: int | None = Field(None, ge=1, description="Only best_of = n is supported.")
    suffix: str | None = Field(None, description="Not supported (must be null).")


class ContentPart(BaseModel):
    # extra keys are kept to be refused by path (openai_fields.unknown_nested), not silently dropped
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # extra keys are kept to be refused by path (openai_fields.unknown_nested), not silently dropped
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    #: an assistant turn's calls (OpenAI's shape), and a tool turn's answer to one of them
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Wins over max_tokens.")
    logprobs: bool | None = Field(None, description="Report each returned token's logprob.")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="Most likely alternatives per token (needs `logprobs`)."
    )


def unknown_fields(body: BaseModel) -> list[str]:
    """The request's top-level fields and ``stream_options`` keys that no model declares, then unknown keys
    of its messages, ``response_format``, ``tools`` and ``tool_choice``
    (:func:`.openai_fields.unknown_nested`), by their path."""
    names = list(body.model_extra or {})
    options = getattr(body, "stream_options", None)
    if options is not None:
        names += [f"stream_options.{k}" for k in options.model_extra or {}]
    return names + unknown_nested(body)


# ---------------------------------------------------------------------------------------------- responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(
        0,
        description="Prompt positions whose keys and values came from the prefix cache (summed over the "
        "choices; 0 with --no-prefix-cache).",
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class S2D2Stats(BaseModel):
    """The request's decoding statistics (summed over its choices)."""

    nfe: int = Field(description="Model forwards this request's choices took part in.")
    nfe_per_token: float
    verify_steps: int
    drafted: int
    accepted: int
    finish_reason: str | None = Field(
        description="The engine's: stop (EOS) or length (null with several choices)."
    )
    acceptance: str = Field(description="The acceptance rule applied: strict, probabilistic (or none).")
    notes: list[str] = Field(default_factory=list, description="Warnings about the settings used.")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]
    source: str = Field(description="Extension: `ar` (the AR mode's exact probability) or `draft`.")


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]
    token_sources: list[str | None] = Field(
        description="Extension: per token, `ar`, `draft`, or null for echoed prompt tokens."
    )


class PromptLogprob(BaseModel):
    logprob: float
    rank: int | None = Field(description="1 = the most likely token; null outside the alternatives.")
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = Field(
        None, description="With the request's `prompt_logprobs` (vLLM's format; keys are token ids)."
    )


class _CompletionBody(BaseModel):
    """The fields a completion and a chat completion share, in their order (each sets its ``object`` and
    the type of its ``choices``)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage | None = None
    s2d2: S2D2Stats | None = None


class CompletionResponse(_CompletionBody):
    object: str = "text_completion"
    choices: list[CompletionChoice]


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = Field(
        None, description="The reply's reasoning (with a reasoning parser: --reasoning-parser)."
    )


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(_CompletionBody):
    object: str = "chat.completion"
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "s2d2"
    #: sampling defaults of a request that omits them (the checkpoint's generation_config.json)
    generation_defaults: dict[str, int | float] = Field(default_factory=dict)
    #: the longest sequence (prompt and output together) the model takes, in tokens (vLLM's field)
    max_model_len: int | None = None
    #: s2d2's own facts about the served model (``block_size``: a request's default block size)
    s2d2: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object; every 4xx (and the rare 5xx) carries one."""

    error: ErrorDetail

"""The OpenAI-compatible wire format: request and response bodies as pydantic models.

Requests are validated strictly (a string where a number belongs is a 400, not a silent conversion);
unknown top-level fields are ignored as OpenAI's own server ignores what it does not know, except the
``s2d2`` extension object, whose fields are exactly the decoding settings of
:class:`s2d2.config.DecodeConfig` (plus ``preset``), so the OpenAPI schema describes each of them.
Value checks that need the model (decoder names, presets, ranges of decoding settings) are left to
``S2D2Model.make_config``, the same code the CLI uses.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..config import DecodeConfig

#: Decoding settings the ``s2d2`` object does not take (the server streams text, not step traces).
_HIDDEN_SETTINGS = {"trace"}


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
        fields[f.name] = (hints[f.name] | None, Field(None, description=desc))
    return create_model(
        "S2D2Settings",
        __config__=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False),
        __doc__="Per-request decoding settings (the s2d2 extension object); unset fields keep the defaults.",
        **fields,
    )


S2D2Settings = _settings_model()


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    include_usage: bool | None = Field(None, description="Send a last chunk with the usage.")


class _Sampling(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str | None = Field(None, description="The served model's name (GET /v1/models); optional.")
    max_tokens: int | None = Field(
        None, ge=1, description="Most tokens to generate (default: the model's decoding default)."
    )
    temperature: float | None = Field(None, ge=0, description="0 = greedy (default: the model's default).")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus filter, in (0, 1].")
    seed: int | None = Field(
        None, ge=-(2**63), le=2**64 - 1, description="Seed of this request's own random generator."
    )
    stop: str | list[str] | None = Field(
        None, description="Up to 4 stop strings; the text stops before the first one (not returned)."
    )
    n: int | None = Field(None, description="Choices per request; only 1 is supported.")
    stream: bool | None = Field(None, description="Stream server-sent events, ending in `data: [DONE]`.")
    stream_options: StreamOptions | None = None
    user: str | None = None
    s2d2: S2D2Settings | None = Field(None, description="Per-request decoding settings (extension).")  # type: ignore[valid-type]


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="The prompt: text, or token ids (a list of one prompt is accepted too)."
    )
    echo: bool | None = Field(None, description="Not supported (must be false).")
    logprobs: int | None = Field(None, description="Not supported (must be null).")
    best_of: int | None = Field(None, description="Only 1 is supported.")
    suffix: str | None = Field(None, description="Not supported (must be null).")


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Alias of max_tokens.")
    logprobs: bool | None = Field(None, description="Not supported (must be false).")


# ---------------------------------------------------------------------------------------------- responses
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class S2D2Stats(BaseModel):
    """The request's decoding statistics."""

    nfe: int = Field(description="Model forwards this request took part in.")
    nfe_per_token: float
    verify_steps: int
    drafted: int
    accepted: int
    finish_reason: str = Field(description="The engine's: stop (EOS) or length.")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    s2d2: S2D2Stats | None = None


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    s2d2: S2D2Stats | None = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "s2d2"


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

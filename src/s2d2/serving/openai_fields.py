"""Request fields beyond the core sampling ones: vLLM's extras the server honours, OpenAI's fields that
have no effect here, OpenAI's fields it does not support, and unknown keys inside nested objects.

- Honoured (vLLM's): ``min_p``, ``repetition_penalty`` (decoding settings), ``include_stop_str_in_output``
  (the stop string that ended the text is kept at its end), ``skip_special_tokens`` (false: special
  tokens are written in the text), ``chat_template_kwargs`` (extra variables of the chat template).
- Accepted with no effect (documented in the README): ``prompt_cache_key`` (the
  prefix cache needs no key), ``safety_identifier``, ``verbosity``, ``prediction: null``, ``audio: null``,
  ``modalities: ["text"]``.
- Refused as unsupported (a 400 with code ``unsupported_parameter``, "... is not supported"): OpenAI's
  other documented fields (:data:`UNSUPPORTED`), and ``prediction`` / ``audio`` / ``modalities`` asking
  for what the server cannot do. A field nobody documents stays ``unknown_parameter``.
- Unknown keys inside a message, ``response_format`` (and its ``json_schema``), ``stream_options`` or a
  ``tools`` entry are a 400 naming their path (:func:`unknown_nested`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

_NO_EFFECT = "Accepted for OpenAI compatibility; no effect here."

#: OpenAI's documented request fields this server does not support (refused by name, not as unknown).
UNSUPPORTED = ("reasoning_effort", "web_search_options", "reasoning", "background", "include", "instructions")
#: The keys OpenAI documents inside nested request objects (any other is a 400 naming its path).
MESSAGE_KEYS = {
    "role", "content", "name", "tool_calls", "tool_call_id", "refusal", "function_call", "audio",
    "reasoning_content",
}  # fmt: skip
RESPONSE_FORMAT_KEYS = {"type", "json_schema"}
JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}
TOOL_KEYS = {"type", "function"}
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


class OpenAIExtras(BaseModel):
    """The fields of the module docstring, shared by both endpoints."""

    min_p: float | None = Field(
        None, ge=0, le=1, description="vLLM's: drop tokens below min_p x the most likely one's probability."
    )
    repetition_penalty: float | None = Field(
        None, gt=0, le=2, description="vLLM's: penalise tokens of the prompt and output so far (1 = off)."
    )
    include_stop_str_in_output: bool | None = Field(
        None, description="vLLM's: keep the stop string that ended the text at its end."
    )
    skip_special_tokens: bool | None = Field(
        None, description="vLLM's: false writes special tokens in the text (default true)."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM's: extra variables for the chat template (chat)."
    )
    prompt_cache_key: str | None = Field(None, description=_NO_EFFECT + " (the prefix cache needs no key)")
    safety_identifier: str | None = Field(None, description=_NO_EFFECT)
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description=_NO_EFFECT)
    prediction: Any = Field(None, description="Only null (predicted outputs are not supported).")
    audio: Any = Field(None, description="Only null (audio output is not supported).")
    modalities: list[str] | None = Field(None, description='Only ["text"].')


def unsupported(body: Any) -> list[str]:
    """The request's fields that OpenAI documents but this server does not support, in order."""
    names = [n for n in (body.model_extra or {}) if n in UNSUPPORTED]
    if getattr(body, "prediction", None) is not None:
        names.append("prediction")
    if getattr(body, "audio", None) is not None:
        names.append("audio")
    if getattr(body, "modalities", None) not in (None, ["text"]):
        names.append("modalities")
    return names


def _extra(obj: Any, allowed: set[str], path: str) -> list[str]:
    """``path.key`` for each key of ``obj`` (a dict or a pydantic model) outside ``allowed``."""
    if isinstance(obj, BaseModel):
        keys = list(obj.model_extra or {})  # (its declared fields are known)
    elif isinstance(obj, dict):
        keys = list(obj)
    else:
        return []
    return [f"{path}.{k}" for k in keys if k not in allowed]


def unknown_nested(body: Any) -> list[str]:
    """Paths of unknown keys inside the request's messages, ``response_format`` and ``tools``."""
    names: list[str] = []
    for i, message in enumerate(getattr(body, "messages", None) or []):
        names += _extra(message, MESSAGE_KEYS, f"messages.{i}")
    rf = getattr(body, "response_format", None)
    if rf is not None:
        names += _extra(rf, RESPONSE_FORMAT_KEYS, "response_format")
        spec = (rf.model_extra or {}).get("json_schema") if isinstance(rf, BaseModel) else None
        names += _extra(spec, JSON_SCHEMA_KEYS, "response_format.json_schema")
    for i, tool in enumerate(getattr(body, "tools", None) or []):
        names += _extra(tool, TOOL_KEYS, f"tools.{i}")
        if isinstance(tool, dict):
            names += _extra(tool.get("function"), FUNCTION_KEYS, f"tools.{i}.function")
    return names

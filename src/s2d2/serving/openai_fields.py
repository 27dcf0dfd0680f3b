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
- Unknown keys at any depth of a message (its content parts, its ``tool_calls``), ``response_format``
  (and its ``json_schema``), a ``tools`` entry or ``tool_choice`` are a 400 naming their path
  (:func:`unknown_nested`); the one rule is :func:`unknown_keys` over a :data:`Shape` per field, which
  the Responses API's checks share.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

_NO_EFFECT = "Accepted for OpenAI compatibility; no effect here."

#: OpenAI's documented request fields this server does not support (refused by name, not as unknown).
UNSUPPORTED = ("reasoning_effort", "web_search_options", "reasoning", "background", "include", "instructions")
#: What a nested request object may hold: each allowed key mapped to the shape of its value (None: any
#: value); a list is checked item by item against the same shape.
Shape = dict[str, "Shape | None"]
#: The keys OpenAI documents inside nested request objects (any other is a 400 naming its path).
MESSAGE_KEYS = {
    "role", "content", "name", "tool_calls", "tool_call_id", "refusal", "function_call", "audio",
    "reasoning_content",
}  # fmt: skip
RESPONSE_FORMAT_KEYS = {"type", "json_schema"}
JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}
TOOL_KEYS = {"type", "function"}
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


def keys(names: set[str] | tuple[str, ...], **nested: Shape) -> Shape:
    """A :data:`Shape` allowing ``names`` (any value) and the ``nested`` keys (values of those shapes)."""
    return {**dict.fromkeys(names), **nested}


TOOL_CALL_SHAPE = keys(("id", "type"), function=keys(("name", "arguments")))
MESSAGE_SHAPE = keys(MESSAGE_KEYS, content=keys(("type", "text")), tool_calls=TOOL_CALL_SHAPE)
NESTED_SHAPES: dict[str, Shape] = {
    "messages": MESSAGE_SHAPE,
    "response_format": keys(RESPONSE_FORMAT_KEYS, json_schema=keys(JSON_SCHEMA_KEYS)),
    "tools": keys(TOOL_KEYS, function=keys(FUNCTION_KEYS)),
    "tool_choice": keys(("type",), function=keys(("name",))),
}


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


def _items(value: Any) -> dict[str, Any] | None:
    """A dict's items, a pydantic model's set fields and extra keys, else None."""
    if isinstance(value, BaseModel):
        fields = {n: getattr(value, n) for n in type(value).model_fields if getattr(value, n) is not None}
        return {**fields, **(value.model_extra or {})}
    return value if isinstance(value, dict) else None


def unknown_keys(value: Any, shape: Shape, path: str) -> list[str]:
    """``path.key`` (at any depth) for each key of ``value`` outside ``shape``; a list's items are each
    checked against ``shape`` (``path.i``); scalars have no keys."""
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in unknown_keys(item, shape, f"{path}.{i}")]
    items = _items(value)
    out: list[str] = []
    for key, item in (items or {}).items():
        if key not in shape:
            out.append(f"{path}.{key}")
        elif shape[key] is not None:
            out += unknown_keys(item, shape[key], f"{path}.{key}")
    return out


def unknown_nested(body: Any) -> list[str]:
    """Paths of unknown keys inside the request's messages, ``response_format``, ``tools`` and
    ``tool_choice`` (:data:`NESTED_SHAPES`)."""
    return [
        p
        for name, shape in NESTED_SHAPES.items()
        for p in unknown_keys(getattr(body, name, None), shape, name)
    ]

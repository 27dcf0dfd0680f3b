"""A validated request body -> prompt token ids, a :class:`DecodeConfig` and the stop strings.

Every check that can fail on user input runs here, before the request reaches the engine, and fails as
a 4xx :class:`~s2d2.serving.errors.APIError`: the model name, unsupported OpenAI options, the prompt
(through the engine's own ``check_prompt``) and the decoding settings (through ``S2D2Model.make_config``,
the code the CLI uses). Settings are layered: the model's defaults, the server's ``--preset`` (or the
request's ``s2d2.preset``), the ``s2d2`` object, then the OpenAI fields (``max_tokens``, ``temperature``,
``top_p``, ``seed``). A request's ``s2d2.preset`` must be a preset name of :data:`s2d2.config.PRESETS`: a
client may not make the server read one of its files (only the server's own ``--preset`` may be a file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import PRESETS, DecodeConfig
from ..engine.request import check_prompt
from ..errors import S2D2Error
from .chat import chat_prompt_ids, encode_text
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest

MAX_STOP = 4
#: Bounds on settings that size the engine's buffers (beyond them a request could exhaust memory).
MAX_UCB_BINS = 256
INT64 = (-(2**63), 2**64 - 1)
#: Temperatures in (0, this) decode greedily: dividing logits by them overflows float32.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
#: Float settings beyond this overflow float32 inside the decoder.
MAX_FLOAT = 1e30


@dataclass
class Prepared:
    """What the engine and the response writer need from one request."""

    prompt_ids: list[int]
    config: DecodeConfig
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def check_model_name(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _unsupported(body: CompletionRequest | ChatCompletionRequest) -> None:
    """OpenAI options the server does not implement: a clear 400 unless they have their neutral value."""
    if body.n not in (None, 1):
        raise bad_request("only n=1 is supported", param="n", code="unsupported_value")
    if isinstance(body, CompletionRequest):
        if body.best_of not in (None, 1):
            raise bad_request("only best_of=1 is supported", param="best_of", code="unsupported_value")
        if body.echo:
            raise bad_request("echo is not supported", param="echo", code="unsupported_value")
        if body.suffix:
            raise bad_request("suffix is not supported", param="suffix", code="unsupported_value")
    if body.logprobs not in (None, False):
        raise bad_request("logprobs are not supported", param="logprobs", code="unsupported_value")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP:
        raise bad_request(f"at most {MAX_STOP} stop strings are allowed", param="stop")
    return [s for s in stops if s]


def _completion_ids(model: Any, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request("only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise bad_request(f"model {model.name} has no tokenizer: send token ids", param="prompt")
        return encode_text(model, prompt)
    return [int(i) for i in prompt]


def _settings(body: CompletionRequest | ChatCompletionRequest, server_preset: str | None) -> dict[str, Any]:
    settings = body.s2d2.model_dump(exclude_none=True) if body.s2d2 is not None else {}
    requested = settings.get("preset")
    if requested is not None and requested not in PRESETS:
        # never a path: a request must not name (and so probe or read) a file on the server
        names = ", ".join(sorted(PRESETS))
        raise bad_request(
            f"unknown preset {requested!r}; a request may name one of: {names}",
            param="s2d2.preset",
            code="invalid_value",
        )
    settings.setdefault("preset", server_preset)
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionRequest) and max_tokens is None:
        max_tokens = body.max_completion_tokens
    top = {"max_new_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p}
    top["seed"] = body.seed
    settings.update({k: v for k, v in top.items() if v is not None})
    if isinstance(settings.get("temperature"), float) and 0 < settings["temperature"] < MIN_TEMPERATURE:
        settings["temperature"] = 0.0
    return settings


def _check_sizes(settings: dict[str, Any], info: Any) -> None:
    for key, value in settings.items():
        if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            raise bad_request(f"{key} is out of range", param=f"s2d2.{key}")
        if isinstance(value, float) and abs(value) > MAX_FLOAT:
            raise bad_request(f"{key} is out of range (|value| <= {MAX_FLOAT:g})", param=f"s2d2.{key}")
    if settings.get("temperature", 0) > MAX_TEMPERATURE:
        raise bad_request(f"temperature must be <= {MAX_TEMPERATURE:g}", param="temperature")
    if settings.get("block_size", 1) > info.max_length:
        raise bad_request(f"block_size must be <= the context ({info.max_length})", param="s2d2.block_size")
    if settings.get("ucb_bins", 1) > MAX_UCB_BINS:
        raise bad_request(f"ucb_bins must be <= {MAX_UCB_BINS}", param="s2d2.ucb_bins")
    stops = settings.get("stop_token_ids", [])
    if any(not 0 <= t < info.vocab_size for t in stops):
        raise bad_request(f"stop_token_ids must lie in [0, {info.vocab_size})", param="s2d2.stop_token_ids")


def _param_of(message: str, settings: dict[str, Any]) -> str | None:
    """The setting a ConfigError message is about (best effort, for ``error.param``)."""
    for key in sorted(settings, key=len, reverse=True):
        if key in message:
            top = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}
            return top.get(key, f"s2d2.{key}")
    return "s2d2.preset" if "preset" in message else None


def build_config(
    model: Any, body: CompletionRequest | ChatCompletionRequest, preset: str | None
) -> DecodeConfig:
    settings = _settings(body, preset)
    _check_sizes(settings, model.info)
    try:
        return model.make_config(**settings)
    except S2D2Error as exc:
        raise bad_request(str(exc), param=_param_of(str(exc), settings), code="invalid_value") from None


def prepare(
    model: Any,
    body: CompletionRequest | ChatCompletionRequest,
    *,
    served_name: str,
    server_preset: str | None = None,
) -> Prepared:
    """Check ``body`` and translate it (see the module docstring); raises a 4xx APIError."""
    check_model_name(body.model, served_name)
    _unsupported(body)
    stop = stop_strings(body.stop)
    config = build_config(model, body, server_preset)
    chat = isinstance(body, ChatCompletionRequest)
    param = "messages" if chat else "prompt"
    try:
        ids = chat_prompt_ids(model, body.messages) if chat else _completion_ids(model, body.prompt)
        check_prompt(ids, model.info)
    except S2D2Error as exc:
        code = "context_length_exceeded" if "too long" in str(exc) else "invalid_prompt"
        raise bad_request(str(exc), param=param, code=code) from None
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Prepared(ids, config, stop, bool(body.stream), include_usage)

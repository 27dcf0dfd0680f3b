"""A validated request body -> its choices (prompt token ids and a :class:`DecodeConfig` each), the stop
strings and how to answer (:class:`Prepared`).

Every check that can fail on user input runs here, before the request reaches the engine, and fails as
a 4xx :class:`~s2d2.serving.errors.APIError` naming the field: the model name, refused OpenAI options
(``functions``, ``best_of`` != ``n``, ``stream_options`` without ``stream``,
``top_logprobs`` without ``logprobs``, ``suffix``), the prompts (through the engine's own
``check_prompt``), an explicit ``max_tokens`` the context cannot hold after the prompt, and the decoding
settings (through ``S2D2Model.make_config``, the code the CLI uses), and the structured-output fields
(:mod:`.structured`: compiled here, so a bad schema is a 400 before anything is queued). Settings are
layered: the model's defaults, the server's ``--preset`` (or the request's ``s2d2.preset``), the
``s2d2`` object, then the OpenAI / vLLM top-level fields (:data:`TOP_LEVEL`, and ``logprobs``). A
request's ``s2d2.preset`` must be a preset name of :data:`s2d2.presets.PRESETS`: a client may not make
the server read one of its files (only the server's own ``--preset`` may be a file).

Choices: each prompt (completions take a list) gets ``n`` of them, in response order ``prompt x n +
choice``; choice j of every prompt is seeded :func:`derived_seed` (``seed + j``), so it equals a request
of its own with that seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import PRESETS, DecodeConfig
from ..constraints import CompiledConstraint
from ..engine.request import check_prompt
from ..errors import S2D2Error
from ..families import ModelInfo
from .chat import FALLBACK_NOTE, chat_prompt_ids, encode_text, unknown_words_notes, uses_fallback
from .errors import APIError, bad_request
from .prompt_scoring import scoring_request
from .protocol import ChatCompletionRequest, CompletionRequest
from .served_model import ServedModel
from .structured import check_settings, compile_for, structured_of, thinking_first
from .tools.request import ToolPlan, chat_tool_plan, refuse_legacy

MAX_STOP = 4
#: Most choices (prompts x n) one request may ask for: each is an engine request.
MAX_CHOICES = 64
#: Bounds on settings that size the engine's buffers (beyond them a request could exhaust memory).
MAX_UCB_BINS = 256
INT64 = (-(2**63), 2**64 - 1)
#: Temperatures in (0, this) decode greedily: dividing logits by them overflows float32.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
#: Float settings beyond this overflow float32 inside the decoder.
MAX_FLOAT = 1e30
#: Decoding settings an OpenAI (or vLLM) top-level field sets, by that field's name.
TOP_LEVEL = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "min_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "logit_bias": "logit_bias",
}
#: A completions or a chat completions request body.
RequestBody = CompletionRequest | ChatCompletionRequest
STRICT_SAMPLING_NOTE = (
    "acceptance=strict commits the AR mode's argmax: at temperature > 0 the text is not a sample of the "
    "model's distribution (acceptance=auto samples exactly)"
)


@dataclass
class Row:
    """One choice: an engine request of its own (choice ``index`` of the response, for prompt
    ``prompt_index``)."""

    index: int
    prompt_index: int
    prompt_ids: list[int]
    config: DecodeConfig


@dataclass
class Prepared:
    """What the engine and the response writer need from one request: its choices (``rows``, in
    response order), its distinct prompts, and how to answer."""

    rows: list[Row]
    prompts: list[list[int]]
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    #: vLLM's ``include_stop_str_in_output`` and ``skip_special_tokens``
    include_stop: bool = False
    skip_special: bool = True
    #: completions' ``echo``: each choice's text starts with its prompt's text (``prompt_texts``)
    echo: bool = False
    prompt_texts: list[str] = field(default_factory=list)
    #: None: no logprobs in the response; k >= 0: each token's logprob and k alternatives
    logprobs: int | None = None
    #: warnings about the settings, reported in the response's ``s2d2.notes``
    notes: list[str] = field(default_factory=list)
    #: structured output: the compiled constraint of every choice (None: free text); a chat request's
    #: tools (the reply is read for calls unless tool_choice is none)
    constraint: CompiledConstraint | None = None
    tools: ToolPlan | None = None
    #: a chat reply's reasoning parser (:mod:`.reasoning.parser`; None: no reasoning is split out)
    reasoning: str | None = None
    #: ``max_tokens: 0`` with ``echo``: only the prompts are scored, nothing is decoded
    score_only: bool = False
    #: vLLM's ``prompt_logprobs``: alternatives per prompt token (None: not asked for)
    prompt_logprobs: int | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.rows[0].prompt_ids

    @property
    def config(self) -> DecodeConfig:
        return self.rows[0].config


def check_model_name(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _unsupported_value(message: str, param: str) -> APIError:
    return bad_request(message, param=param, code="unsupported_value")


def _refused(body: RequestBody) -> None:
    """OpenAI options the server does not implement: a 400 naming them unless they are neutral."""
    refuse_legacy(body)
    if isinstance(body, CompletionRequest) and (body.tool_choice not in (None, "none") or body.tools):
        name = "tools" if body.tools else "tool_choice"
        raise _unsupported_value(f"{name} is for chat completions", name)
    if body.stream_options is not None and not body.stream:
        raise bad_request(
            "stream_options is only allowed with stream=true", param="stream_options", code="invalid_value"
        )
    if isinstance(body, CompletionRequest):
        if body.best_of is not None and body.best_of != (body.n or 1):
            raise _unsupported_value("best_of must equal n (no server-side ranking of choices)", "best_of")
        if body.suffix:
            raise _unsupported_value("suffix is not supported", "suffix")
    elif body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")


def _logprobs(body: RequestBody) -> int | None:
    """How many alternatives to report per token (0: the token's own logprob only), None: no logprobs."""
    if isinstance(body, CompletionRequest):
        return body.logprobs
    return (body.top_logprobs or 0) if body.logprobs else None


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP:
        raise bad_request(f"at most {MAX_STOP} stop strings are allowed", param="stop")
    return [s for s in stops if s]


def _completion_prompts(model: ServedModel, prompt: Any) -> list[tuple[list[int], str | None]]:
    """Each prompt of a completions request as ``(token ids, its text or None for token ids)``."""
    many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    prompts = list(prompt) if many else [prompt]
    out = []
    for p in prompts:
        if isinstance(p, str):
            if model.tokenizer is None:
                raise bad_request(f"model {model.name} has no tokenizer: send token ids", param="prompt")
            out.append((encode_text(model, p), p))
        else:
            out.append(([int(i) for i in p], None))
    return out


def _logit_bias(bias: dict[str, float], param: str) -> dict[int, float]:
    """JSON's string keys as token ids."""
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            raise bad_request(
                f"logit_bias keys must be token ids, got {key!r}", param=param, code="invalid_value"
            ) from None
    return out


def _settings(body: RequestBody, server_preset: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings for ``make_config`` and, per setting a top-level field gave, that field's name."""
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
    if "logit_bias" in settings:
        settings["logit_bias"] = _logit_bias(settings["logit_bias"], "s2d2.logit_bias")
    top = {name: getattr(body, name) for name in TOP_LEVEL}
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        top["max_tokens"] = body.max_completion_tokens
    if top["top_k"] == -1:
        top["top_k"] = 0
    if top["logit_bias"] is not None:
        top["logit_bias"] = _logit_bias(top["logit_bias"], "logit_bias")
    given = {TOP_LEVEL[k]: k for k, v in top.items() if v is not None}
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        given["max_new_tokens"] = "max_completion_tokens"
    settings.update({TOP_LEVEL[k]: v for k, v in top.items() if v is not None})
    logprobs = _logprobs(body)
    if logprobs is not None:
        settings["logprobs"] = logprobs
        given["logprobs"] = "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
    if isinstance(settings.get("temperature"), float) and 0 < settings["temperature"] < MIN_TEMPERATURE:
        settings["temperature"] = 0.0
    return settings, given


def _name(key: str, given: dict[str, str]) -> str:
    """The request field a setting came from: its top-level name, else ``s2d2.<key>``."""
    return given.get(key, f"s2d2.{key}")


def _check_sizes(settings: dict[str, Any], given: dict[str, str], info: ModelInfo) -> None:
    for key, value in settings.items():
        if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            raise bad_request(f"{key} is out of range", param=_name(key, given))
        if isinstance(value, float) and abs(value) > MAX_FLOAT:
            raise bad_request(f"{key} is out of range (|value| <= {MAX_FLOAT:g})", param=_name(key, given))
    if settings.get("temperature", 0) > MAX_TEMPERATURE:
        raise bad_request(f"temperature must be <= {MAX_TEMPERATURE:g}", param=_name("temperature", given))
    if settings.get("block_size", 1) > info.max_length:
        raise bad_request(f"block_size must be <= the context ({info.max_length})", param="s2d2.block_size")
    sizes = settings.get("plan_block_sizes")
    if isinstance(sizes, list) and any(isinstance(b, int) and b > info.max_length for b in sizes):
        raise bad_request(
            f"plan_block_sizes must be <= the context ({info.max_length})", param="s2d2.plan_block_sizes"
        )
    if settings.get("ucb_bins", 1) > MAX_UCB_BINS:
        raise bad_request(f"ucb_bins must be <= {MAX_UCB_BINS}", param="s2d2.ucb_bins")
    for key in ("stop_token_ids", "logit_bias"):
        if any(not 0 <= t < info.vocab_size for t in settings.get(key, ())):
            raise bad_request(f"{key} token ids must lie in [0, {info.vocab_size})", param=_name(key, given))


def _param_of(message: str, settings: dict[str, Any], given: dict[str, str]) -> str | None:
    """The setting a ConfigError message is about (best effort, for ``error.param``)."""
    for key in sorted(settings, key=len, reverse=True):
        if key in message:
            return _name(key, given)
    return "s2d2.preset" if "preset" in message else None


def build_config(
    model: ServedModel, body: RequestBody, preset: str | None
) -> tuple[DecodeConfig, dict[str, str]]:
    """The request's :class:`DecodeConfig` and the top-level field name of each setting it gave."""
    settings, given = _settings(body, preset)
    _check_sizes(settings, given, model.info)
    try:
        return model.make_config(**settings), given
    except S2D2Error as exc:
        msg = str(exc)
        raise bad_request(msg, param=_param_of(msg, settings, given), code="invalid_value") from None


def derived_seed(seed: int | None, choice: int) -> int | None:
    """Choice ``choice``'s seed: ``seed + choice``, wrapped into [-(2**63), 2**64) (None stays None)."""
    if seed is None:
        return None
    value = seed + choice
    return value - 2**64 if value > INT64[1] else value


def _prompts(
    model: ServedModel, body: RequestBody, tools: ToolPlan | None = None
) -> list[tuple[list[int], Any]]:
    """The request's prompts, checked as the engine checks them (``tools`` rendered unless none)."""
    chat = isinstance(body, ChatCompletionRequest)
    param = "messages" if chat else "prompt"
    try:
        if chat:
            shown = tools if tools is not None and tools.parses else None
            fmt = shown.format if shown is not None else None
            tools_shown = shown.tools if shown else None
            ids = chat_prompt_ids(model, body.messages, tools_shown, fmt, body.chat_template_kwargs)
            prompts = [(ids, None)]
        else:
            prompts = _completion_prompts(model, body.prompt)
        for ids, _ in prompts:
            check_prompt(ids, model.info)
    except S2D2Error as exc:
        code = "context_length_exceeded" if "too long" in str(exc) else "invalid_prompt"
        raise bad_request(str(exc), param=param, code=code) from None
    return prompts


def _check_length(ids: list[list[int]], config: DecodeConfig, given: dict[str, str], info: ModelInfo) -> None:
    """An explicit max_tokens the context cannot hold after a prompt is a 400 (never silently cut)."""
    if "max_new_tokens" not in given:
        return
    longest = max(len(p) for p in ids)
    if longest + config.max_new_tokens > info.max_length:
        name = given["max_new_tokens"]
        raise bad_request(
            f"{name} ({config.max_new_tokens}) plus the prompt's {longest} tokens exceed the model's "
            f"context of {info.max_length} positions",
            param=name,
            code="context_length_exceeded",
        )


def _rows(prompts: list[list[int]], config: DecodeConfig, n: int) -> list[Row]:
    if len(prompts) * n > MAX_CHOICES:
        param = "n" if n > 1 else "prompt"
        raise bad_request(f"at most {MAX_CHOICES} choices (prompts x n) per request", param=param)
    rows = []
    for p, ids in enumerate(prompts):
        for j in range(n):
            cfg = config if j == 0 else config.replace(seed=derived_seed(config.seed, j))
            rows.append(Row(len(rows), p, ids, cfg))
    return rows


def _notes(config: DecodeConfig, model: ServedModel, body: RequestBody) -> list[str]:
    notes = []
    if config.decoder == "s2d2" and config.acceptance == "strict" and config.temperature > 0:
        notes.append(STRICT_SAMPLING_NOTE)
    if isinstance(body, ChatCompletionRequest) and uses_fallback(model, body.messages):
        notes.append(FALLBACK_NOTE)
    return notes


def prepare(
    model: ServedModel,
    body: RequestBody,
    *,
    served_name: str,
    server_preset: str | None = None,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> Prepared:
    """Check ``body`` and translate it (see the module docstring); raises a 4xx APIError.
    ``tool_parser``: the server's call format (None: detected); ``reasoning_parser``: the server's
    reasoning parser (None: none), applied to chat replies."""
    check_model_name(body.model, served_name)
    _refused(body)
    body, score_only = scoring_request(body)
    chat = isinstance(body, ChatCompletionRequest)
    tools = chat_tool_plan(model, body, tool_parser) if chat else None
    forced = tools is not None and tools.mode in ("required", "named")
    structured = structured_of(body, tools.constraint if tools is not None else None, forced)
    structured = thinking_first(structured, reasoning_parser if chat else None, body)
    stop = stop_strings(body.stop)
    config, given = build_config(model, body, server_preset)
    constraint = compile_for(model, structured)
    check_settings(structured, config, given)
    prompts = _prompts(model, body, tools)
    ids = [p for p, _ in prompts]
    _check_length(ids, config, given, model.info)
    echo = isinstance(body, CompletionRequest) and bool(body.echo)
    texts = [t if t is not None else model.decode_ids(p) for p, t in prompts] if echo else []
    return Prepared(
        rows=_rows(ids, config, body.n or 1),
        prompts=ids,
        stop=stop,
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        include_stop=bool(body.include_stop_str_in_output),
        skip_special=body.skip_special_tokens is not False,
        echo=echo,
        prompt_texts=texts,
        logprobs=config.logprobs,
        constraint=constraint,
        tools=tools,
        reasoning=reasoning_parser if chat else None,
        notes=_notes(config, model, body) + unknown_words_notes(model, ids),
        score_only=score_only,
        prompt_logprobs=getattr(body, "prompt_logprobs", None),
    )

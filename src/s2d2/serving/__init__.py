"""An OpenAI-compatible streaming server on the batched engine (``s2d2 serve``).

One concept per module: :mod:`.protocol` (request and response bodies), :mod:`.errors` (OpenAI error
objects), :mod:`.prepare` (a request -> its choices: prompt ids + decoding config each),
:mod:`.token_logprobs` (OpenAI's logprobs formats, one token vocabulary), :mod:`.prompt_scoring`
(prompt logprobs: echo, ``max_tokens: 0``, ``prompt_logprobs``), :mod:`.chat` (chat messages -> prompt,
with the fallback template of models without one), :mod:`.detokenizer` (incremental text),
:mod:`.engine_thread` (the engine's own thread and per-request queues), :mod:`.responses` (JSON and
server-sent event bodies), :mod:`.metrics` (Prometheus text), :mod:`.limits` (body size and time),
:mod:`.request_checks` (known fields, valid Unicode, prompts certainly over the context), :mod:`.security`
(Host check, API key), :mod:`.drain` (503 while shutting down), :mod:`.docs_ui` (``/docs`` without a
CDN), :mod:`.app` (``create_app``), :mod:`.server` (uvicorn with connection timeouts and a bounded
graceful shutdown), :mod:`.load` (``s2d2 bench-serve``), :mod:`.ray` (``s2d2 serve --ray``); the packages
:mod:`.tools` (tool calls), :mod:`.openai_responses` (OpenAI's Responses API) and
:mod:`.anthropic_messages` (Anthropic's Messages API, on the same chat path), with what those two share in
:mod:`.translated`.
What the server needs of the model it serves is :class:`.served_model.ServedModel`.

FastAPI and uvicorn are the optional extra ``serve`` (``pip install 's2d2[serve]'``); nothing here is
imported by the rest of the library.
"""

from __future__ import annotations

from typing import Any

from .served_model import ServedModel

__all__ = ["ServedModel", "create_app"]


def create_app(model: ServedModel, **options: Any) -> Any:
    """See :func:`s2d2.serving.app.create_app` (imported lazily: FastAPI is an optional extra)."""
    from .app import create_app as _create_app

    return _create_app(model, **options)

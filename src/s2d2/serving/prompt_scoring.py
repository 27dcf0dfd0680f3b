"""Prompt scoring over HTTP: each prompt token's exact AR-mode log-probability.

Completions' ``echo`` with ``logprobs`` puts the prompt's tokens first in the choice's ``logprobs`` (the
first token's value null, as OpenAI and vLLM answer), and vLLM's ``prompt_logprobs: k`` adds a
``prompt_logprobs`` list to each choice (:func:`~.token_logprobs.prompt_logprobs_format`); both come from
``model.score``, the scorer ``model.loglikelihood`` and the lm-eval model use, so a log-likelihood read
over HTTP equals the in-process one. ``max_tokens: 0`` is allowed with ``echo`` alone: the request then
only scores (no engine request; ``finish_reason`` ``length``, no completion tokens). lm-eval's
``local-completions`` model reads log-likelihoods this way (``echo`` with ``logprobs: 1``).
"""

from __future__ import annotations

from typing import Any

from .errors import bad_request
from .protocol import ChatCompletionRequest, CompletionRequest
from .served_model import ServedModel
from .token_logprobs import Scored, TokenTexts


def scoring_request(
    body: CompletionRequest | ChatCompletionRequest,
) -> tuple[CompletionRequest | ChatCompletionRequest, bool]:
    """The body to decode with and whether the request only scores its prompts (``max_tokens: 0`` with
    ``echo``); a 400 for ``max_tokens: 0`` without ``echo`` and for ``prompt_logprobs`` with ``stream``."""
    completion = isinstance(body, CompletionRequest)
    if completion and body.prompt_logprobs is not None and body.stream:
        raise bad_request(
            "prompt_logprobs is not available with stream=true", param="prompt_logprobs", code="invalid_value"
        )
    if body.max_tokens != 0:
        return body, False
    if not (completion and body.echo):
        raise bad_request(
            "max_tokens must be at least 1 (0 only on /v1/completions with echo=true, to score the prompt)",
            param="max_tokens",
            code="invalid_value",
        )
    return body.model_copy(update={"max_tokens": None}), True


def prompt_top(prep: Any) -> int | None:
    """Alternatives the prompts' scores need (None: no prompt scores): ``echo`` with ``logprobs`` and
    ``prompt_logprobs``; at least 1, so a prompt token's rank is known when it is the most likely."""
    wanted = [prep.prompt_logprobs] + ([prep.logprobs] if prep.echo else [])
    ks = [k for k in wanted if k is not None]
    return max(1, *ks) if ks else None


def prompt_scores(model: ServedModel, prompts: list[list[int]], k: int) -> list[Scored]:
    """Each prompt's tokens with their exact AR-mode logprobs and ``k`` alternatives (``model.score``);
    the first token has none."""
    long = [p for p in prompts if len(p) > 1]
    scores = iter(model.score([(p[:1], p[1:]) for p in long], top_logprobs=k) if long else [])
    out = []
    for ids in prompts:
        s = next(scores) if len(ids) > 1 else None
        lps: list[float | None] = [None] + (list(s.logprobs) if s is not None else [])
        top = s.top if s is not None and s.top is not None else [[] for _ in ids[1:]]
        tops: list[Any] = [None, *top]
        texts, top_texts = TokenTexts(model.decode_ids).add_scored(ids, tops)
        sources: list[str | None] = [None] + ["ar"] * (len(ids) - 1)
        out.append(Scored(texts, list(ids), lps, sources, tops, top_texts))
    return out

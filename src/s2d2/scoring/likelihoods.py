"""The likelihood API of :class:`~s2d2.model.S2D2Model`: what the model's AR mode (block size 1) says of
given text or token ids.

``score`` takes token ids; ``loglikelihood`` and ``loglikelihood_rolling`` take text and encode it as
lm-eval's HF model does (a pair's split, truncation and rolling windows), so that an lm-eval task scores
the same tokens here as with a causal LM there. The numbers come from :class:`~s2d2.scoring.scorer.Scorer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import PromptError
from ..families import ModelAdapter, ModelInfo
from .scorer import Scorer, TokenScores, rolling_windows


class Likelihoods:
    """Scoring methods of a model; the host class provides ``adapter``, ``info``, ``tokenizer``, ``name``
    and ``encode(text) -> list[int]``."""

    adapter: ModelAdapter
    info: ModelInfo
    tokenizer: Any
    name: str
    encode: Callable[..., list[int]]
    _scorer: Scorer | None = None

    @property
    def scorer(self) -> Scorer:
        """The AR-mode scorer of this model (its own key/value rows, apart from the engine's)."""
        if self._scorer is None:
            self._scorer = Scorer(self.adapter)
        return self._scorer

    def score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, top_logprobs: int = 0
    ) -> list[TokenScores]:
        """Exact AR-mode (block size 1) log-probabilities of each ``(context, continuation)`` of token ids:
        one :class:`~s2d2.scoring.scorer.TokenScores` per request (per continuation token its logprob,
        whether it is the argmax and, with ``top_logprobs`` k > 0, the k most likely tokens)."""
        return self.scorer.score(requests, top_logprobs=top_logprobs)

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context stands for (BOS, else EOS), as lm-eval's HF model uses it."""
        info, tok = self.info, self.tokenizer
        for candidate in (info.bos_token_id, *info.eos_token_ids, getattr(tok, "bos_token_id", None)):
            if candidate is not None:
                return int(candidate)
        raise PromptError(f"model {self.name} has no BOS or EOS token to stand for an empty context")

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of a ``(context, continuation)`` text pair split as lm-eval's HF model splits them:
        trailing spaces of the context go to the continuation, the continuation is what encoding the
        whole adds after the context's own ids, and an empty context is the :attr:`prefix_token_id`."""
        if context == "":
            return [self.prefix_token_id], self.encode(continuation)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx = self.encode(context)
        return ctx, self.encode(context + continuation)[len(ctx) :]

    def likelihood_requests(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """:meth:`encode_pair` of each text pair, fitted to the model: a pair longer than the model's
        context loses the context's start (as lm-eval's HF model truncates); an over-long continuation
        is a one-line :class:`PromptError`."""
        requests = []
        for context, continuation in pairs:
            ctx, cont = self.encode_pair(context, continuation)
            room = self.scorer.max_tokens - len(cont)
            if room < (1 if self.info.shifted else 0):
                raise PromptError(
                    f"a continuation of {len(cont)} tokens does not fit the model's context "
                    f"({self.scorer.max_tokens} tokens with its context)"
                )
            requests.append((ctx[max(len(ctx) - room, 0) :], cont))
        return requests

    def rolling_requests(self, text: str) -> list[tuple[list[int], list[int]]]:
        """The disjoint windows scoring every token of ``text`` once, each as long as the model's context
        allows, as lm-eval's HF model windows them (the first after :attr:`prefix_token_id`)."""
        return rolling_windows(self.encode(text), self.prefix_token_id, self.scorer.max_tokens - 1)

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Per ``(context, continuation)`` text pair: the continuation's log-likelihood and whether all
        its tokens are the greedy ones (see :meth:`likelihood_requests`)."""
        return [(s.total, all(s.greedy)) for s in self.score(self.likelihood_requests(pairs))]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Per text: the log-likelihood of all its tokens (see :meth:`rolling_requests`)."""
        windows = [self.rolling_requests(text) for text in texts]
        scores = iter(self.score([w for per_text in windows for w in per_text]))
        return [sum(next(scores).total for _ in per_text) for per_text in windows]

"""OpenAI's logit adjustments: ``logit_bias``, presence / frequency penalties and ``min_tokens``.

A pure, batched transform of raw logits, applied before any sampling transform (temperature, top-k,
top-p). The engine applies the same adjustment to the drafter's and to the verifier's logits of a
position, so the lossless family stays lossless against AR decoding with the same settings.

For the query of one position with ``count[v]`` = occurrences of token ``v`` among the tokens generated
before that position (the prompt excluded, as OpenAI counts) and ``generated`` = how many tokens were
generated before it::

    adjusted[v] = logits[v] - presence_penalty * (count[v] > 0) - frequency_penalty * count[v] + bias[v]

and, while ``generated < min_tokens``, every stop / EOS id gets ``-inf``. vLLM's ``repetition_penalty``
``r`` (1 = off) then divides a positive logit by ``r`` and multiplies a negative one by ``r`` for every
token that occurs in the prompt or among the tokens generated before the position.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LogitsAdjust:
    """One request's adjustment settings (hashable; built with :meth:`of`).

    ``bias``: ``(token_id, bias)`` pairs sorted by id; ``stop_ids``: the ids ``min_tokens`` holds back.
    """

    bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    stop_ids: tuple[int, ...] = ()
    repetition_penalty: float = 1.0
    #: the prompt's distinct token ids (only kept when ``repetition_penalty`` is set)
    prompt_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, cfg: Any, stop_ids: Sequence[int] = (), prompt_ids: Sequence[int] = ()) -> LogitsAdjust:
        """From a :class:`~s2d2.config.DecodeConfig`; ``stop_ids``: the ids that end the request (the
        model's EOS ids unless ``ignore_eos``, plus ``cfg.stop_token_ids``); ``prompt_ids``: its prompt."""
        bias = tuple(sorted((int(t), float(b)) for t, b in cfg.logit_bias.items() if b != 0))
        rep = float(getattr(cfg, "repetition_penalty", 1.0))
        return cls(
            repetition_penalty=rep,
            prompt_ids=tuple(sorted({int(t) for t in prompt_ids})) if rep != 1.0 else (),
            bias=bias,
            presence_penalty=float(cfg.presence_penalty),
            frequency_penalty=float(cfg.frequency_penalty),
            min_tokens=int(cfg.min_tokens),
            stop_ids=tuple(sorted({int(t) for t in stop_ids})),
        )

    @property
    def needs_counts(self) -> bool:
        """Whether :func:`adjust_logits` reads ``counts`` (a penalty is set)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @functools.cached_property
    def active(self) -> bool:
        """False when the adjustment is the identity (the engine then skips it entirely)."""
        holds_stops = self.min_tokens > 0 and bool(self.stop_ids)
        return bool(self.bias) or self.needs_counts or holds_stops


def token_counts(tokens: torch.Tensor, valid: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``counts[i, v]`` = how often ``v`` occurs in ``tokens[i]`` where ``valid[i]``: ``[n, T] -> [n, V]``.

    ``tokens``: long ``[n, T]`` (any value where not valid); ``valid``: bool ``[n, T]``. Float32 result on
    ``tokens.device``.
    """
    counts = torch.zeros(tokens.shape[0], vocab_size, dtype=torch.float32, device=tokens.device)
    ids = tokens.clamp(0, vocab_size - 1)
    return counts.scatter_add_(1, ids, valid.to(torch.float32))


def _row(pairs: Sequence[tuple[int, float]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """A ``[V]`` float32 row: ``value`` at each ``(id, value)``, ids outside the vocabulary dropped."""
    kept = [(t, v) for t, v in pairs if 0 <= t < vocab_size]
    row = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if kept:
        ids = torch.tensor([t for t, _ in kept], dtype=torch.long, device=device)
        vals = torch.tensor([v for _, v in kept], dtype=torch.float32, device=device)
        row = row.scatter(0, ids, vals)
    return row


def adjust_logits(
    logits: torch.Tensor, adjust: LogitsAdjust, counts: torch.Tensor | None, generated: torch.Tensor
) -> torch.Tensor:
    """The adjusted logits ``[n, V]`` float32 (see the module docstring); ``logits`` is not modified.

    ``logits``: ``[n, V]``, one row per queried position; ``counts``: ``[n, V]`` occurrences among the
    tokens generated before each row's position (needed only when a penalty is set, else may be None);
    ``generated``: long ``[n]``, how many tokens were generated before each row's position. Runs on
    ``logits.device`` without a host sync.
    """
    out = logits.to(torch.float32)
    if not adjust.active:
        return out
    n, vocab = out.shape
    if adjust.needs_counts:
        if counts is None or tuple(counts.shape) != (n, vocab):
            raise ValueError(f"adjust_logits needs counts of shape ({n}, {vocab}) for the penalties")
        c = counts.to(device=out.device, dtype=torch.float32)
        out = out - adjust.presence_penalty * (c > 0).to(torch.float32) - adjust.frequency_penalty * c
        if adjust.repetition_penalty != 1.0:
            in_prompt = _row([(t, 1.0) for t in adjust.prompt_ids], vocab, out.device) > 0
            seen = (c > 0) | in_prompt.view(1, vocab)
            r = adjust.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
    if adjust.bias:
        out = out + _row(adjust.bias, vocab, out.device)
    if adjust.min_tokens > 0 and adjust.stop_ids:
        stops = _row([(t, 1.0) for t in adjust.stop_ids], vocab, out.device) > 0
        early = generated.to(out.device).view(n, 1) < adjust.min_tokens
        out = out.masked_fill(early & stops.view(1, vocab), float("-inf"))
    return out

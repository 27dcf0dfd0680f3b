"""What the engine gives back: a finished request (:class:`DecodeOutput`) and, per step, what changed
for one request (:class:`RequestOutput`, the unit of streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decoding.stats import GenerationStats, StepTrace
from .logprobs import TokenLogprob


@dataclass
class DecodeOutput:
    """A finished request: new token ids (through the first stop token), statistics, optional trace."""

    token_ids: list[int]
    stats: GenerationStats
    trace: list[StepTrace] | None = None
    request_id: Any = None
    status: str = "finished"
    error: str | None = None
    #: the exception behind ``error`` (re-raised by the single-prompt API)
    exception: BaseException | None = field(default=None, repr=False)
    #: one entry per token of ``token_ids`` when the request's config asks for ``logprobs``
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    """What one step did for one request: final tokens added since the last output, and whether it ended."""

    request_id: Any
    new_token_ids: list[int]
    finished: bool
    output: DecodeOutput | None = None
    #: aligned with ``new_token_ids`` when the request asks for ``logprobs``
    new_logprobs: list[TokenLogprob] | None = None

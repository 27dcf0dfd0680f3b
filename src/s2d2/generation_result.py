"""What ``S2D2Model.generate`` returns for one prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import DecodeConfig
from .decoding.stats import GenerationStats, StepTrace
from .engine.logprobs import TokenLogprob


@dataclass
class GenerationResult:
    """What ``generate`` returns: the new text and token ids (through the first stop token) and stats."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    trace: list[StepTrace] | None = None
    config: DecodeConfig | None = field(default=None, repr=False)
    #: the one-line reason when ``generate_batch(..., errors="return")`` could not decode this prompt
    error: str | None = None
    #: one entry per token when asked for (``logprobs=0`` or ``k``): the token's log-probability, whether
    #: it is the AR mode's exact value (``source="ar"``) or the drafter's, and the top-k alternatives
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        out = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        return out

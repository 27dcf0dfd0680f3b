"""Log-probabilities of committed tokens, as the engine reports them.

Every value is ``log_softmax`` of the model's raw float32 logits over the whole vocabulary (no sampling
transform applied), so a token the AR mode verified carries exactly the log-likelihood that
:mod:`s2d2.scoring.scorer` gives for it. ``source`` says which forward the value comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class LogprobSource(StrEnum):
    """Which distribution a committed token's log-probability was read from."""

    #: the AR mode's (block size 1) distribution at that position: a verification, a shifted model's
    #: slot 0, or an AR decoder's step; exact
    AR = "ar"
    #: the drafter's distribution (a token committed without verification: baselines, skipped steps, the
    #: fallback's top-up)
    DRAFT = "draft"


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token: its id, its log-probability, where that came from, and (when asked for) the
    ``top`` most likely tokens of the same distribution as ``(token_id, logprob)``, most likely first."""

    token_id: int
    logprob: float
    source: LogprobSource
    top: tuple[tuple[int, float], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "token_id": self.token_id,
            "logprob": self.logprob,
            "source": self.source.value,
            "top": [[t, lp] for t, lp in self.top],
        }

"""Per-generation statistics and the optional per-step trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepTrace:
    """One decoding step: which block positions were committed and how."""

    block_start: int
    step: int
    #: ``(absolute position, token id, how)`` with how in accepted | resampled | fallback | edited
    commits: list[tuple[int, int, str]] = field(default_factory=list)
    verified: bool = False
    span: int = 0
    accepted: int = 0
    #: per commit (same order): the drafter's confidence p(token) and the verifier's probability q(token),
    #: each None where the step did not report it
    probs: list[tuple[float | None, float | None]] = field(default_factory=list)
    #: the step's drafts came from a pre-draft group of the previous (fused) verification: no draft forward
    predrafted: bool = False
    #: the step planner's choice for this step's verification (``plan=auto``): mode, k, positions,
    #: expected tokens, the step's predicted and measured forward ms
    plan: dict[str, Any] | None = None


@dataclass(slots=True)
class GenerationStats:
    """Counters of one generation. ``nfe`` counts the forwards of its decoding: prefill (fewer where a
    prefix came from the cache), draft, verify, commit; forwards that only recompute the cache after a
    preemption are counted apart (``nfe_recompute``), so a preempted request reports the NFE it would
    have reported without the preemption."""

    nfe_prefill: int = 0
    nfe_draft: int = 0
    nfe_verify: int = 0
    nfe_commit: int = 0
    #: forwards recomputing the cache after a preemption (not in ``nfe``)
    nfe_recompute: int = 0
    #: times the request was preempted (its pages taken back while it decoded)
    preemptions: int = 0
    #: prompt positions whose keys/values came from the prefix cache (not prefilled)
    cached_prompt_tokens: int = 0
    #: seconds from admission to the first final token (measured where the engine streams)
    first_token_seconds: float = 0.0
    generated_tokens: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    #: verifications whose whole span was accepted (the forward bought no correction)
    full_accepts: int = 0
    seconds: float = 0.0
    steps: int = 0
    blocks: int = 0
    fallback_commits: int = 0
    edits: int = 0
    #: fused verification: steps whose draft came from a pre-draft group (no draft forward), and fused
    #: verifications whose outcome had no group (the next step drafted afresh or reused stale drafts)
    predraft_hits: int = 0
    predraft_misses: int = 0
    #: steps whose next drafts were the unverified (stale) drafts a planned verification left
    stale_reuses: int = 0
    #: steps the step planner made AR-only instead of a draft forward (one token, no draft)
    ar_only_steps: int = 0
    #: tokens committed by the AR-mode lead a draft forward carried (its first masked slot, ``plan=auto``)
    ar_leads: int = 0
    #: tokens fed to the model over all of this request's forwards (the cost of bigger forwards)
    query_tokens: int = 0
    finish_reason: str = "length"

    @property
    def nfe(self) -> int:
        return self.nfe_prefill + self.nfe_draft + self.nfe_verify + self.nfe_commit

    @property
    def nfe_per_token(self) -> float:
        return self.nfe / max(self.generated_tokens, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nfe"] = self.nfe
        return d

    def add(self, other: GenerationStats) -> None:
        """Accumulate ``other`` into this one (for totals over many generations)."""
        for k, v in asdict(other).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(self, k, getattr(self, k) + v)

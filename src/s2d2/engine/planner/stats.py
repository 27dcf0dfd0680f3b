"""The step planner's counters over an engine's life (``LLMEngine.stats()``'s ``plan_*`` keys)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..draft_step import VerifyMode


@dataclass
class PlannerStats:
    """Planner counters over an engine's steps."""

    steps: int = 0
    rows: int = 0
    modes: dict[str, int] = field(default_factory=lambda: {m.value: 0 for m in VerifyMode})
    k_sum: int = 0
    seconds: float = 0.0
    predicted_ms: float = 0.0
    degraded: int = 0
    deferred: int = 0
    over_budget_steps: int = 0
    errors: int = 0
    #: requests whose block size was chosen by load (``plan_block_sizes``), and the sizes' sum
    block_choices: int = 0
    block_size_sum: int = 0
    #: requests of ``plan="auto"`` that their load put on plain fixed verification (:mod:`.plan_regime`)
    fixed_choices: int = 0
    #: requests of ``plan="auto"`` that their load put on AR (:mod:`.regime`)
    ar_choices: int = 0
    #: requests of ``plan="auto"`` per admission choice: ``"ar"``, ``"fixed-B"`` or ``"planned-B"``
    admissions: dict[str, int] = field(default_factory=dict)

    def count_block_choice(self, block_size: int) -> None:
        """A request was given ``block_size`` by load (:mod:`.block_size`)."""
        self.block_choices += 1
        self.block_size_sum += block_size

    def count_admission(self, mode: str, block_size: int | None, open_size: bool) -> None:
        """A plan=auto request was admitted as ``mode`` (``ar``, ``fixed`` or ``planned``) at
        ``block_size``; ``open_size``: its settings left the block size open."""
        key = "ar" if block_size is None else f"{mode}-{block_size}"
        self.admissions[key] = self.admissions.get(key, 0) + 1
        if mode == "ar":
            self.ar_choices += 1
        elif mode == "fixed":
            self.fixed_choices += 1
        if open_size and block_size is not None:
            self.count_block_choice(block_size)

    def to_dict(self, engine_steps: int) -> dict[str, Any]:
        n = max(engine_steps, 1)
        return {
            "plan_steps": self.steps,
            "plan_rows": self.rows,
            **{f"plan_{m.replace('-', '_')}": c for m, c in self.modes.items()},
            "plan_mean_k": self.k_sum / self.rows if self.rows else None,
            "plan_ms_per_step": 1e3 * self.seconds / n,
            "plan_predicted_ms_per_step": self.predicted_ms / self.steps if self.steps else None,
            "plan_over_budget_steps": self.over_budget_steps,
            "plan_degraded_rows": self.degraded,
            "plan_deferred_rows": self.deferred,
            "plan_errors": self.errors,
            "plan_block_choices": self.block_choices,
            "plan_fixed_choices": self.fixed_choices,
            "plan_ar_choices": self.ar_choices,
            "plan_admissions": dict(sorted(self.admissions.items())),
            "plan_mean_block_size": self.block_size_sum / self.block_choices if self.block_choices else None,
        }

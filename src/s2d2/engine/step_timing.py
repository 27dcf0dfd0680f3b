"""Where an engine's step time goes: the forward, and everything else (host bookkeeping, the device
math of the step, admission and retirement)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepTiming:
    """Engine steps that ran a forward, with their forward and other seconds summed."""

    steps: int = 0
    forward_seconds: float = 0.0
    other_seconds: float = 0.0

    def add(self, forward: float, other: float) -> None:
        self.steps += 1
        self.forward_seconds += forward
        self.other_seconds += other

    def per_step_ms(self) -> tuple[float, float]:
        """Mean (forward, other) milliseconds per step."""
        n = max(self.steps, 1)
        return 1e3 * self.forward_seconds / n, 1e3 * self.other_seconds / n

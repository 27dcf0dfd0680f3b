"""Where an engine's step time goes: the forward, and everything else (host bookkeeping, the device
math of the step, admission and retirement)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTiming:
    """Engine steps that ran a forward, with their forward and other seconds summed."""

    steps: int = 0
    forward_seconds: float = 0.0
    other_seconds: float = 0.0
    #: with a cost profile: its predicted milliseconds summed, and (predicted, measured forward) ms per step
    predicted_ms: float = 0.0
    pairs: list[tuple[float, float]] = field(default_factory=list)

    def add(self, forward: float, other: float, predicted_ms: float | None = None) -> None:
        self.steps += 1
        self.forward_seconds += forward
        self.other_seconds += other
        if predicted_ms is not None:
            self.predicted_ms += predicted_ms
            self.pairs.append((predicted_ms, 1e3 * forward))

    def per_step_ms(self) -> tuple[float, float]:
        """Mean (forward, other) milliseconds per step."""
        n = max(self.steps, 1)
        return 1e3 * self.forward_seconds / n, 1e3 * self.other_seconds / n

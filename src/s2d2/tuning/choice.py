"""Which trial becomes the preset: the fastest one within ``max_drop`` of AR's accuracy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Accuracy comparisons allow this much float slack (accuracies are ratios of small integers).
_EPS = 1e-9


@dataclass(frozen=True)
class TrialPoint:
    """One finished trial as the chooser, the plot and the table see it."""

    number: int
    accuracy: float
    nfe_per_token: float
    seconds_per_problem: float
    settings: dict[str, Any]
    figures: dict[str, Any]

    @classmethod
    def from_trial(cls, trial: Any) -> TrialPoint:
        f = trial.user_attrs["figures"]
        return cls(
            trial.number, f["accuracy"], f["nfe_per_token"], f["seconds_per_problem"],
            dict(trial.user_attrs["settings"]), dict(f),
        )  # fmt: skip


def complete_points(study: Any) -> list[TrialPoint]:
    """Every finished trial of ``study`` that recorded its figures, in trial order."""
    from optuna.trial import TrialState

    return [
        TrialPoint.from_trial(t)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "figures" in t.user_attrs and "settings" in t.user_attrs
    ]


def accuracy_floor(ar_accuracy: float, max_drop: float) -> float:
    """The lowest accuracy a chosen configuration may have."""
    return ar_accuracy - max_drop - _EPS


def choose(points: list[TrialPoint], ar_accuracy: float, max_drop: float) -> tuple[TrialPoint, bool]:
    """The lowest-NFE/token trial whose accuracy is within ``max_drop`` of AR's (ties: more accurate,
    then earlier), and True; if no trial is that accurate, the most accurate one (ties: cheaper) and
    False."""
    if not points:
        raise ValueError("no finished trials to choose from")
    floor = accuracy_floor(ar_accuracy, max_drop)
    ok = [p for p in points if p.accuracy >= floor]
    if ok:
        return min(ok, key=lambda p: (p.nfe_per_token, -p.accuracy, p.number)), True
    return min(points, key=lambda p: (-p.accuracy, p.nfe_per_token, p.number)), False


def pareto_numbers(points: list[TrialPoint]) -> set[int]:
    """Trial numbers on the (NFE/token, accuracy) Pareto front."""
    from ..bench.report import pareto_frontier

    front = pareto_frontier([(p.nfe_per_token, p.accuracy) for p in points])
    return {points[i].number for i in front}


__all__ = ["TrialPoint", "accuracy_floor", "choose", "complete_points", "pareto_numbers"]

"""The progress bar of ``s2d2 tune``: trials done, the best configuration so far, the time left."""

from __future__ import annotations

import sys
import time
from typing import Any


class TuneProgress:
    """An Optuna callback driving a tqdm bar (on stderr).

    "Best so far" is the lowest NFE/token among this study's trials within the accuracy floor (AR's
    accuracy minus ``max_drop``), else the most accurate trial; "left" is the time budget's remainder.
    """

    def __init__(
        self,
        trials: int,
        budget_s: float | None,
        ar_accuracy: float,
        floor: float,
        *,
        enabled: bool = True,
        started: float | None = None,
    ):
        from tqdm.auto import tqdm

        self.t0 = time.perf_counter() if started is None else started
        self.budget_s = budget_s
        self.ar_accuracy = ar_accuracy
        self.floor = floor
        self.best: tuple[float, float, int] | None = None  # (nfe/token, accuracy, trial)
        self.bar = tqdm(total=trials, desc="tune", unit="trial", file=sys.stderr, disable=not enabled)
        self._refresh()

    def __call__(self, study: Any, trial: Any) -> None:
        fig = trial.user_attrs.get("figures")
        if fig is not None:
            cand = (fig["nfe_per_token"], fig["accuracy"], trial.number)
            self.best = self._better(self.best, cand)
        self.bar.update(1)
        self._refresh()

    def _better(self, old: tuple[float, float, int] | None, new: tuple[float, float, int]) -> tuple:
        if old is None:
            return new
        ok_old, ok_new = old[1] >= self.floor, new[1] >= self.floor
        if ok_old != ok_new:
            return new if ok_new else old
        if ok_new:
            return new if (new[0], -new[1]) < (old[0], -old[1]) else old
        return new if (-new[1], new[0]) < (-old[1], old[0]) else old

    def _refresh(self) -> None:
        parts = [f"AR acc {self.ar_accuracy:.3f}"]
        if self.best is not None:
            nfe, acc, num = self.best
            mark = "" if acc >= self.floor else " (below floor)"
            parts.append(f"best #{num}: {nfe:.3f} NFE/tok @ acc {acc:.3f}{mark}")
        if self.budget_s is not None:
            left = max(self.budget_s - (time.perf_counter() - self.t0), 0.0)
            parts.append(f"{int(left // 60)}:{int(left % 60):02d} left")
        self.bar.set_postfix_str(", ".join(parts), refresh=True)

    def close(self) -> None:
        self.bar.close()


__all__ = ["TuneProgress"]

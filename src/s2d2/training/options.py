"""What a tiny-gsm training run trains with: the caller's values, else a resumed run's own, else the
defaults for a new run."""

from __future__ import annotations

import dataclasses

from s2d2.tasks.tiny_gsm.curriculum import check_hard_focus
from s2d2.training.ema import EMA_DECAY, check_ema
from s2d2.training.schedule import AR_FIRST, LR, check_ar_first, check_lr

__all__ = ["HARD_FOCUS", "RunOptions"]

#: Training problems without carrying or borrowing columns are kept with probability 1 - HARD_FOCUS, with
#: one 1 - HARD_FOCUS / 2 (new runs; see tiny_gsm.curriculum.keep_probability): dev AR .972 against .948.
HARD_FOCUS = 0.6


@dataclasses.dataclass
class RunOptions:
    """The settings of one :func:`s2d2.training.loop.train_tiny` run (its arguments; ``total_s`` in
    seconds): the caller's values, else a resumed run's own (:meth:`resumed`), else the defaults for a new
    run (:meth:`checked`)."""

    total_s: float
    steps: int | None
    block_mix: dict[int, float] | None
    ar_first: float | None
    lr: float | None
    ema: float | None
    hard_focus: float | None

    def resumed(self, ck: dict, minutes: float) -> RunOptions:
        """These options, those not given taken from the checkpoint ``ck`` (older runs: no AR phase, no
        EMA, no hard focus)."""
        return RunOptions(
            total_s=ck.get("total_s", self.total_s) if minutes <= 0 else self.total_s,
            steps=ck.get("steps", self.steps) if self.steps is None else self.steps,
            block_mix=ck.get("block_mix") if self.block_mix is None else self.block_mix,
            ar_first=ck.get("ar_first", 0.0) if self.ar_first is None else self.ar_first,
            lr=ck.get("lr", LR) if self.lr is None else self.lr,
            ema=ck.get("ema_decay", 0.0) if self.ema is None else self.ema,
            hard_focus=ck.get("hard_focus", 0.0) if self.hard_focus is None else self.hard_focus,
        )

    def checked(self, hard_focus: float = HARD_FOCUS) -> RunOptions:
        """The defaults filled in (``hard_focus``: the task's default), each value checked (``ValueError``
        with a one-line message)."""
        return dataclasses.replace(
            self,
            ar_first=check_ar_first(AR_FIRST if self.ar_first is None else self.ar_first),
            lr=check_lr(LR if self.lr is None else self.lr),
            ema=check_ema(EMA_DECAY if self.ema is None else self.ema),
            hard_focus=check_hard_focus(hard_focus if self.hard_focus is None else self.hard_focus),
        )

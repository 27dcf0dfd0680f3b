"""How many intra-op threads tiny-gsm training uses (1 or 2, whichever is faster right now)."""

from __future__ import annotations

import torch

__all__ = ["ThreadChooser"]


class ThreadChooser:
    """Use 1 or 2 intra-op threads, whichever is faster right now (never more than 2).

    Measured on the 2-core machine: with another process busy on one core, two OpenMP threads are ~5x
    SLOWER than one (6-7 s vs 1.3 s per step); alone, two are faster. Starts with one thread; at its 8th
    and 30th step and every ``probe_every`` steps the other setting is tried for up to ``probe_len``
    steps (abandoned after one step if that step is clearly slower) and kept if its time per position is
    lower. It also probes at once when the last 5 steps are 1.4x slower than the setting's settled speed.
    ``fixed``: use that many threads always and never probe (a machine shared with other work).
    """

    def __init__(self, probe_every: int = 150, probe_len: int = 3, fixed: int | None = None):
        if fixed is not None and fixed < 1:
            raise ValueError(f"threads must be >= 1, got {fixed}")
        self.fixed = fixed
        self.n = 1 if fixed is None else fixed
        self.probe_every, self.probe_len = probe_every, probe_len
        self.recent: list[float] = []
        self.trial: list[float] | None = None
        self.settled = float("inf")
        self.after_degraded = False
        self.count = 0  # steps seen by this process (a resumed run probes early too)
        torch.set_num_threads(self.n)

    @staticmethod
    def _median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    def record(self, sec_per_pos: float, step: int) -> None:
        if self.fixed is not None:
            return
        self.count += 1
        if self.trial is not None:
            self.trial.append(sec_per_pos)
            base = self._median(self.recent[-20:])
            mine = self._median(self.trial)
            if sec_per_pos > 1.3 * base or (len(self.trial) >= self.probe_len and mine >= base):
                self.n = 3 - self.n  # revert
                torch.set_num_threads(self.n)
                self.trial = None
                if self.after_degraded:  # both settings slow now: re-learn this one's speed
                    self.recent, self.settled = [], float("inf")
            elif len(self.trial) >= self.probe_len:
                self.recent = []  # keep the new setting
                self.trial = None
            return
        self.recent.append(sec_per_pos)
        self.recent = self.recent[-40:]
        if len(self.recent) == 10:
            self.settled = self._median(self.recent)
        degraded = len(self.recent) >= 15 and self._median(self.recent[-5:]) > 1.4 * self.settled
        if (step % self.probe_every == 0 or self.count in (8, 30) or degraded) and len(self.recent) >= 4:
            self.n = 3 - self.n
            torch.set_num_threads(self.n)
            self.trial = []
            self.after_degraded = degraded
            if degraded:  # the old speed is stale: compare against the recent one
                self.recent = self.recent[-5:]

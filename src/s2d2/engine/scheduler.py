"""Waiting and running queues: admission bounded by ``max_num_seqs`` and a KV budget, retirement.

Only the scheduler moves a request between queues and frees its memory. Admission is first come, first
served; a request that does not fit waits until enough rows retire (rows leave as soon as they finish,
whatever their batch-mates do).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .request import Request, Status


class Scheduler:
    """Admits waiting requests into the running batch and retires finished ones."""

    def __init__(self, pool: Any, *, max_num_seqs: int, kv_budget_tokens: int | None = None):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if kv_budget_tokens is not None and kv_budget_tokens < 1:
            raise ValueError(f"kv_budget_tokens must be >= 1, got {kv_budget_tokens}")
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.kv_budget_tokens = kv_budget_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.reserved = 0
        #: waiting requests aborted since the last retirement (reported by the next one)
        self._aborted_waiting: list[Request] = []

    def fits_alone(self, req: Request) -> bool:
        return self.kv_budget_tokens is None or req.kv_need <= self.kv_budget_tokens

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def admit(self) -> list[Request]:
        """Move waiting requests into the running batch while rows and KV budget allow."""
        admitted = []
        room = min(len(self.waiting), self.max_num_seqs - len(self.running))
        if room > 0:
            self.pool.reserve_rows(len(self.running) + room)
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            budget = self.kv_budget_tokens
            if budget is not None and self.reserved + req.kv_need > budget and self.running:
                break
            self.waiting.popleft()
            req.cache.state = self.pool.new_state()
            self.reserved += req.kv_need
            req.mark_started()
            self.running.append(req)
            admitted.append(req)
        return admitted

    def abort(self, request_id: Any) -> bool:
        """Abort a request: a waiting one leaves at once, a running one at the next retirement."""
        for req in list(self.waiting):
            if req.request_id == request_id:
                self.waiting.remove(req)
                req.status, req.action = Status.ABORTED, None
                self._aborted_waiting.append(req)
                return True
        for req in self.running:
            if req.request_id == request_id and not req.status.done:
                req.abort_requested = True
                return True
        return False

    def retire(self) -> list[Request]:
        """Take finished, failed and aborted rows out of the batch and give their memory back; also report
        waiting requests aborted since the last call."""
        out, self._aborted_waiting = self._aborted_waiting, []
        for req in list(self.running):
            if req.abort_requested and not req.status.done:
                req.status, req.action = Status.ABORTED, None
            if req.status.done:
                self.running.remove(req)
                self.pool.release(req.state)
                self.reserved -= req.kv_need
                out.append(req)
        return out

    @property
    def occupancy(self) -> float:
        return len(self.running) / self.max_num_seqs

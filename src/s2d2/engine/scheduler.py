"""Waiting and running queues, key/value memory, admission, preemption and retirement.

Only the scheduler moves a request between queues and gives it memory or takes it back.

With a paged pool (:class:`~s2d2.forward.kv_pool.KVPool`, the lean forward) a row holds pages for
what it has cached plus its next forward, nothing more:

- **admission** is first come, first served, by what the request needs now: the longest cached prefix
  of its prompt is adopted from the prefix cache (:meth:`~s2d2.forward.kv_pages.PagePool.match`), and
  the pages of its first forward must be free (or evictable);
- **each step**, before the forward, every row gets the pages its segment writes
  (:meth:`Scheduler.allocate`); when they run out, the most recently admitted row is **preempted**: its
  pages go back, it keeps its tokens and decoding state and returns to the head of the queue, and when
  re-admitted its cache is recomputed (``CacheProgress.restore_to``) before it resumes exactly where it
  stopped;
- **after the step**, full pages of committed positions are published to the prefix cache.

transformers' own forward (one ``DynamicCache`` a row) is not paged: there a request reserves its worst
case (prompt + ``max_new_tokens`` + one block) against ``kv_budget_tokens`` and is never preempted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..forward.kv_pages import OutOfPages
from ..forward.kv_pool import KVPool
from ..forward.segment import Segment
from .request import Request, Status


class Scheduler:
    """Admits waiting requests into the running batch, pages their memory, retires finished ones."""

    def __init__(
        self,
        pool: Any,
        *,
        max_num_seqs: int,
        kv_budget_tokens: int | None = None,
        prefill_chunk: int = 512,
    ):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if kv_budget_tokens is not None and kv_budget_tokens < 1:
            raise ValueError(f"kv_budget_tokens must be >= 1, got {kv_budget_tokens}")
        self.pool = pool
        self.paged = isinstance(pool, KVPool)
        self.max_num_seqs = max_num_seqs
        self.kv_budget_tokens = kv_budget_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: positions reserved by running rows (unpaged pools only)
        self.reserved = 0
        #: waiting requests aborted (or failed) since the last retirement (reported by the next one)
        self._aborted_waiting: list[Request] = []

    # ------------------------------------------------------------------ queues
    def fits_alone(self, req: Request) -> bool:
        """Whether ``req`` could decode with the whole budget to itself (else it can never run)."""
        if self.kv_budget_tokens is None:
            return True
        if self.paged:
            return math.ceil(req.kv_need / self.pool.page_size) <= self.pool.max_pages
        return req.kv_need <= self.kv_budget_tokens

    def budget_text(self) -> str:
        """The KV budget in words (for errors)."""
        if self.paged and self.kv_budget_tokens is not None:
            ps = self.pool.page_size
            return f"{self.pool.max_pages} pages of {ps} positions, {self.pool.max_pages * ps} in all"
        return f"{self.kv_budget_tokens} positions"

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def admit(self) -> list[Request]:
        """Move waiting requests into the running batch while rows and memory allow; returns the newly
        started ones (re-admitted preempted rows resume the forward they were waiting for)."""
        started = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            fresh = req.cache.restore_to is None
            if fresh and self._prefix_in_flight(req):
                break  # a running row is computing this prompt's prefix: reuse it in a step or two
            if not (self._take_pages(req, fresh) if self.paged else self._reserve(req)):
                if not self.running:  # nothing to wait for: it can never fit (fits_alone rules this out)
                    self.waiting.popleft()
                    req.status, req.action = Status.FAILED, None
                    req.error = "the request does not fit the KV budget even alone"
                    self._aborted_waiting.append(req)
                    continue
                break
            self.waiting.popleft()
            self.running.append(req)
            if fresh:
                req.mark_started()
                started.append(req)
            else:
                req.status = Status.RUNNING
        return started

    def _prefix_in_flight(self, req: Request) -> bool:
        """Whether a running row is still prefilling prompt pages ``req`` shares (under the same key: the
        first page and the next page the row will publish are equal): admitting ``req`` now would
        compute them twice."""
        cache = req.cache
        if not self.paged or cache.prefix_key is None or cache.prompt_blocks <= self.pool.page_size:
            return False
        ps = self.pool.page_size
        head = req.tokens[:ps]
        for r in self.running:
            at = r.cache.published // ps * ps
            if (
                r.cache.prefix_key == cache.prefix_key
                and at + ps <= min(r.cache.prompt_blocks, cache.prompt_blocks)
                and r.tokens[:ps] == head
                and r.tokens[at : at + ps] == req.tokens[at : at + ps]
            ):
                return True
        return False

    def _reserve(self, req: Request) -> bool:
        budget = self.kv_budget_tokens
        if budget is not None and self.reserved + req.kv_need > budget and self.running:
            return False
        req.cache.state = self.pool.new_state()
        self.reserved += req.kv_need
        return True

    def _take_pages(self, req: Request, fresh: bool) -> bool:
        """Give ``req`` a row: the cached prefix it can reuse, and pages for its first forward."""
        pool, cache = self.pool, req.cache
        state = pool.new_state()
        target = cache.prompt_blocks if fresh else cache.restore_to
        matched = 0
        if cache.prefix_key is not None and target > 0:
            known = req.tokens[: req.n_prompt] if fresh else req.cached_tokens(target)
            # a shifted model keeps one position to compute: its forward predicts the next block's slot 0
            pages, matched = pool.pages.match(
                cache.prefix_key,
                known,
                max_positions=target - 1 if req.info.shifted else target,
                multiple_of=req.config.block_size,
                record=fresh,
            )
            pool.adopt(state, pages)
        need = min(target, matched + self.prefill_chunk) + req.config.block_size
        if not pool.can_hold(state, need):
            pool.release(state)
            return False
        pool.ensure(state, need)
        cache.state, cache.published = state, matched
        if fresh:
            req.stats.cached_prompt_tokens += matched
        return True

    # ------------------------------------------------------------------ one step
    def allocate(self, rows: Sequence[Request], segments: Sequence[Segment]) -> tuple[list, list]:
        """Pages for every row's segment (``[0, length + n)``), oldest rows first; when pages run out the
        newest running row is preempted (it may be one of ``rows``). Returns the rows and segments that
        run this step. The usual step is one pass: the few rows whose pages end take theirs, in order,
        and only a step that runs out of pages walks the rows again (:meth:`_allocate_preempting`)."""
        if not self.paged:
            return list(rows), list(segments)
        short = [
            i for i, (req, seg) in enumerate(zip(rows, segments, strict=True))
            if (st := req.cache.state).length + seg.n > st.capacity
        ]  # fmt: skip
        for i in short:
            state = rows[i].cache.state
            try:
                self.pool.ensure(state, state.length + segments[i].n)
            except OutOfPages:
                return self._allocate_preempting(rows, segments, i)
        return list(rows), list(segments)

    def _allocate_preempting(
        self, rows: Sequence[Request], segments: Sequence[Segment], first: int
    ) -> tuple[list, list]:
        """:meth:`allocate` from row ``first`` on, whose pages ran out (every row before it holds its
        pages): preempt the newest running row until the row's pages are free, or it is the one
        preempted; then the same for each later row."""
        kept: list[tuple[Request, Segment]] = list(zip(rows[:first], segments[:first], strict=True))
        for req, seg in zip(rows[first:], segments[first:], strict=True):
            if req.status is not Status.RUNNING:  # preempted for an older row's pages this step
                continue
            state = req.cache.state
            if state.length + seg.n <= state.capacity:  # its pages hold the segment already
                kept.append((req, seg))
                continue
            while req.status is Status.RUNNING:
                try:
                    self.pool.ensure(state, state.length + seg.n)
                    kept.append((req, seg))
                    break
                except OutOfPages:
                    victim = next(r for r in reversed(self.running) if r.status == Status.RUNNING)
                    self.preempt(victim)
                    kept = [(r, s) for r, s in kept if r is not victim]
        return [r for r, _ in kept], [s for _, s in kept]

    def preempt(self, req: Request) -> None:
        """Take ``req``'s pages back and queue it first; it keeps its tokens and decoding state, and its
        cache is recomputed up to its current length when it is re-admitted."""
        cache = req.cache
        length = cache.state.length
        cache.restore_to = length if cache.restore_to is None else max(cache.restore_to, length)
        self.pool.pages.preempt(cache.state.slot)  # counted there; an admitted row always holds pages
        self.pool.release(cache.state)
        cache.state = None
        self.running.remove(req)
        self.waiting.appendleft(req)
        req.status = Status.WAITING
        req.stats.preemptions += 1

    def publish(self, rows: Sequence[Request]) -> None:
        """Offer each row's newly cached full pages of committed positions to the prefix cache."""
        if not self.paged:
            return
        ps, pages, running = self.pool.page_size, self.pool.pages, Status.RUNNING
        for req in rows:
            cache = req.cache
            state = cache.state
            if cache.prefix_key is None or state is None or req.status is not running:
                continue
            length = state.length
            if length // ps > cache.published // ps:
                full = length // ps * ps  # only full pages are published: their tokens, no copy where closed
                tokens = req.tokens if full <= req.cursor.start else req.cached_tokens(full)
                pages.publish(state.slot, cache.prefix_key, tokens, full)
                cache.published = length

    # ------------------------------------------------------------------ leaving
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
        staying = []
        for req in self.running:
            if req.abort_requested and not req.status.done:
                req.status, req.action = Status.ABORTED, None
            if req.status.done:
                self.pool.release(req.state)
                if not self.paged:
                    self.reserved -= req.kv_need
                out.append(req)
            else:
                staying.append(req)
        if out:
            self.running[:] = staying  # in place, by identity (no field-by-field Request comparisons)
        return out

    @property
    def occupancy(self) -> float:
        return len(self.running) / self.max_num_seqs

    def memory_stats(self) -> dict[str, float]:
        """Page counters and preemptions (:meth:`~s2d2.forward.kv_pages.PagePool.stats`); an unpaged
        pool never preempts."""
        return self.pool.stats() if self.paged else {"preemptions": 0}

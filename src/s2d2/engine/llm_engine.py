"""The engine: requests in, one batched forward per step, results out (continuous batching).

Each :meth:`LLMEngine.step` admits waiting requests (scheduler), runs every running row's segment in ONE
forward (runner), lets each row consume its logits and find its next forward (step), and retires the
rows that finished (scheduler). Requests join and leave at any step; each row is at its own block and
step, with its own settings. The single-prompt path is this engine with one request.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..config import DecodeConfig
from ..constraints.compiler import CompiledConstraint
from ..cost.step_cost import StepCost, median_abs_error
from ..decoding.routing_state import EngineRoutingState
from ..decoding.stats import GenerationStats
from ..errors import ConfigError, PromptError, S2D2Error
from ..families.base import ModelAdapter
from ..forward.kv_pool import DEFAULT_PAGE_SIZE
from .admission import Admission
from .emitted import Emitted
from .outputs import DecodeOutput, RequestOutput
from .planner import StepPlanner
from .request import Request, Status
from .request_limits import (
    default_max_query_tokens_per_row,
)
from .row_forward import RowForward
from .runner import ModelRunner, run_isolating_failures
from .scheduler import Scheduler
from .step import MAX_VOCAB, DeviceOps, advance, after_forward, apply_plans, check_progress
from .step_timing import StepTiming


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


class LLMEngine:
    """Continuous batching over one model adapter (see the module docstring).

    Engine-wide settings: ``max_num_seqs`` (rows decoding together), ``kv_budget_tokens`` (most cached
    positions the rows hold together: a budget of ``kv_budget_tokens // kv_page_size`` pages, taken as rows
    grow, with preemption when they run out; see :mod:`.scheduler`), ``kv_page_size`` (positions a page),
    ``prefix_cache`` (reuse the cached pages of equal prompt prefixes across requests),
    ``prefill_chunk`` (most prompt positions a row prefills per forward), ``max_query_tokens_per_row``
    (most query tokens one row feeds to one forward; default: every shipped preset fits, see
    :mod:`.request_limits`; it also caps the prefill chunk), ``cost`` (a step-cost profile,
    :mod:`.cost`: each step's predicted time is recorded beside the measured one; the planner of
    ``plan=auto`` requests plans with it, :mod:`.planner`), ``max_num_batched_tokens`` (most query tokens
    of one step, all rows together, as vLLM's; the planner keeps each step within it),
    ``capture_graphs`` (the lean forward on CUDA captures the common batch shapes' graphs when the engine
    is made, with one progress line, instead of each at its first batch: what a model's engine and the
    server do). Everything else is per request. With ``stream=True`` every step reports each running
    row's newly final tokens.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        *,
        max_num_seqs: int = 16,
        kv_budget_tokens: int | None = None,
        prefill_chunk: int = 512,
        stream: bool = False,
        max_query_tokens_per_row: int | None = None,
        cost: StepCost | None = None,
        prefix_cache: bool = True,
        kv_page_size: int = DEFAULT_PAGE_SIZE,
        max_num_batched_tokens: int | None = None,
        capture_graphs: bool = False,
    ):
        limit = max_query_tokens_per_row
        if limit is None:
            limit = default_max_query_tokens_per_row(adapter.info.default_block_size)
        if limit < 1:
            raise ConfigError(f"max_query_tokens_per_row must be >= 1, got {limit}")
        #: most query tokens one row may feed to one forward (:mod:`.request_limits`)
        self.max_query_tokens_per_row = limit
        self.adapter = adapter
        if adapter.info.vocab_size > MAX_VOCAB:
            raise ConfigError(f"vocabularies over {MAX_VOCAB} tokens are not supported")
        #: the model's device: the step's tensors are made there, and its one transfer a step is counted
        self.device = DeviceOps(adapter.device)
        if kv_page_size < 1:
            raise ConfigError(f"kv_page_size must be >= 1, got {kv_page_size}")
        if kv_budget_tokens is not None and kv_budget_tokens < kv_page_size:
            raise ConfigError(
                f"kv_budget_tokens must hold at least one page of {kv_page_size} positions, "
                f"got {kv_budget_tokens}"
            )
        pages = None if kv_budget_tokens is None else kv_budget_tokens // kv_page_size
        reserve = max_num_seqs * adapter.info.max_length  # each row holds at most the model's length
        self.pool = adapter.new_pool(page_size=kv_page_size, max_pages=pages, reserve_tokens=reserve)
        if capture_graphs:  # the common batch shapes' CUDA graphs now (else each at its first batch)
            adapter.prepare(self.pool)
        self.prefix_cache = prefix_cache
        self.runner = ModelRunner(adapter, prefill_chunk=min(prefill_chunk, limit))
        #: whether forwards save a prediction for the row's next one (a shifted family), which the step
        #: keeps in the row's state after the forward
        self._saves = adapter.info.shifted
        self.scheduler = Scheduler(
            self.pool,
            max_num_seqs=max_num_seqs,
            kv_budget_tokens=kv_budget_tokens,
            prefill_chunk=self.runner.prefill_chunk,
        )
        self.stream = stream
        #: common AR and lossless steps take their lanes (:class:`.step.postprocess.Lanes`); off: every row
        #: takes the general step (the two write the same rows: tests compare them)
        self.lanes = True
        self._ids = itertools.count()
        self._emitted = Emitted()
        #: UCB statistics shared by this engine's requests with ``ucb_scope="engine"``
        self.routing = EngineRoutingState()
        self.timing = StepTiming()
        self.cost = cost
        if max_num_batched_tokens is not None and max_num_batched_tokens < limit:
            raise ConfigError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_query_tokens_per_row "
                f"({limit}): one row must always fit a step"
            )
        #: the planning phase of each step (``plan=auto`` rows, the step's query-token budget)
        self.planner = StepPlanner(
            cost, prefill_chunk=self.runner.prefill_chunk,
            max_num_batched_tokens=max_num_batched_tokens,
        )  # fmt: skip
        #: shapes each added request (its block size, limits, caching): :mod:`.admission`
        self.admission = Admission(
            adapter, self.planner, max_query_tokens_per_row=limit, prefill_chunk=self.runner.prefill_chunk,
            prefix_cache=prefix_cache, make_generator=self.device.generator,
        )  # fmt: skip

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        config: DecodeConfig,
        request_id: Any = None,
        *,
        expected_rows: int | None = None,
        constraint: CompiledConstraint | None = None,
    ) -> Any:
        """Queue a request; returns its id. A bad prompt raises :class:`PromptError` at once, settings
        over the engine's limits a :class:`~.request_limits.RequestLimitError` naming the setting.
        Where the settings leave the block size open (``plan_block_sizes``), it is chosen for the load
        (:mod:`.admission`): ``expected_rows`` rows sharing its steps (default: the running and waiting
        requests and this one, at most ``max_num_seqs``). ``constraint``: structured output, a grammar
        compiled for this model's vocabulary (:mod:`s2d2.constraints`; :mod:`.step.grammar`)."""
        rows = expected_rows if expected_rows is not None else self.num_running + self.num_waiting + 1
        rid = next(self._ids) if request_id is None else request_id
        req = self.admission.request(
            prompt_ids, config, rid, min(rows, self.max_num_seqs), self.routing, constraint=constraint
        )
        if not self.scheduler.fits_alone(req):
            raise PromptError(
                f"the request needs {req.kv_need} cached positions (prompt + max_new_tokens + one block), "
                f"more than the engine's KV budget holds ({self.scheduler.budget_text()})"
            )
        self.scheduler.add(req)
        self._emitted.start(rid)
        return rid

    def check_limits(self, config: DecodeConfig) -> int:
        """See :meth:`.admission.Admission.check_limits` (the server checks a request's settings early)."""
        return self.admission.check_limits(config)

    def abort(self, request_id: Any) -> bool:
        """Abort a request; its row is freed at the next step. False if it is unknown or done."""
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def running_ids(self) -> list[Any]:
        """Ids of the requests decoding now (admitted, not retired yet)."""
        return [r.request_id for r in self.scheduler.running]

    def is_running(self, request_id: Any) -> bool:
        return any(r.request_id == request_id for r in self.scheduler.running)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def stats(self) -> dict[str, float]:
        """Engine-wide counters: forwards, rows and query tokens fed, steps with a forward, host transfers,
        and where step time goes (forward vs other), per step."""
        c, t = self.runner.counters, self.timing
        fwd_ms, other_ms = t.per_step_ms()
        steps = max(t.steps, 1)
        return {
            "forwards": c.forwards,
            "rows": c.rows,
            "query_tokens": c.query_tokens,
            "mean_rows_per_forward": c.mean_rows,
            "steps": t.steps,
            "host_transfers": self.device.host_transfers,
            "host_syncs_per_step": self.device.host_transfers / steps,
            "forward_ms_per_step": fwd_ms,
            "other_ms_per_step": other_ms,
            "predicted_ms_per_step": t.predicted_ms / steps if self.cost is not None else None,
            "predicted_abs_error": median_abs_error(t.pairs) if self.cost is not None else None,
            **self.scheduler.memory_stats(),
            **self.planner.stats.to_dict(t.steps),
        }

    # ------------------------------------------------------------------ one step
    @staticmethod
    def _fail(req: Request, exc: BaseException) -> None:
        req.status, req.action, req.error, req.exception = Status.FAILED, None, _one_line(exc), exc

    def _guarded(self, req: Request, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(req, ...)``; an error fails this request alone."""
        try:
            fn(req, *args)
        except Exception as exc:  # one request's failure must not stop its batch-mates
            self._fail(req, exc)

    def step(self) -> list[RequestOutput]:
        """Admit, plan, run one batched forward, postprocess, retire. Returns what changed per request.

        Who writes what (docs/ARCHITECTURE.md): the scheduler admits, preempts and retires rows and takes
        their pages; the planner returns plans, which the step applies; the runner builds each row's
        part of the forward (writing nothing) and runs it (touching no row); the step then advances each
        row once, from what the forward kept and what verification accepted."""
        t_begin = time.perf_counter()
        forward = shape = None
        for req in self.scheduler.admit():
            self._guarded(req, advance)
        plans = self.planner.plan(self.scheduler.running)
        apply_plans(plans)
        rows, parts = self._layouts(plans.deferred)
        rows, parts = self.scheduler.allocate(rows, parts)
        if rows:
            segments = [f.segment for f in parts]
            shape = None if self.cost is None else self.runner.shape(segments)
            t0 = time.perf_counter()
            ran, logits = run_isolating_failures(self.runner.run, rows, segments, self._fail)
            forward = time.perf_counter() - t0
            plans.measured(forward)
            if len(ran) != len(rows):  # some rows failed in the forward: the others' parts
                by_row = {id(r): f for r, f in zip(rows, parts, strict=True)}
                parts = [by_row[id(r)] for r in ran]
            rows = ran
            if self._saves:  # a shifted family: each row keeps the prediction its forward saved for it
                for f in parts:
                    f.segment.keep_prediction()
            with self.device.phase():
                after_forward(self.device, rows, logits, parts, self._fail, self.lanes)
            check_progress(rows, self._fail)  # (every row ends: engine/step/progress.py)
            self.scheduler.publish(rows)
        outputs = []
        if self.stream:
            outputs += [o for o in map(self._emitted.progress, self.scheduler.running) if o.new_token_ids]
        outputs += [self._emitted.finished(req) for req in self.scheduler.retire()]
        if forward is not None:
            predicted = None if shape is None else self.cost.predict_ms(shape)
            self.timing.add(forward, time.perf_counter() - t_begin - forward, predicted)
        return outputs

    def _layouts(self, deferred: set[int]) -> tuple[list[Request], list[RowForward]]:
        """Each row that runs this step, with its part of the forward; a row whose part cannot be built
        fails alone."""
        rows, parts = [], []
        layout = self.runner.layout
        for req in self.scheduler.running:
            if req.action is None and req.cache.recompute_left <= 0:
                continue  # idle
            if req.abort_requested or req.status.done or (deferred and id(req) in deferred):
                continue
            try:
                parts.append(layout(req))
                rows.append(req)
            except Exception as exc:
                self._fail(req, exc)
        return rows, parts

    # ------------------------------------------------------------------ many requests
    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        configs: Sequence[DecodeConfig],
        *,
        on_finish: Callable[[int, DecodeOutput], None] | None = None,
        constraints: Sequence[CompiledConstraint | None] | None = None,
    ) -> list[DecodeOutput]:
        """Decode every prompt with its config (and its structured-output ``constraints[i]``, if any);
        results in input order.

        A prompt the engine rejects gives a ``DecodeOutput`` with ``status="failed"`` and its one-line
        ``error``; the others decode as usual. ``on_finish(index, output)`` is called as each one ends.
        """
        results: dict[int, DecodeOutput] = {}
        index: dict[Any, int] = {}
        rows = self.num_running + self.num_waiting + len(prompts)  # the load they will decode under
        for i, (prompt, cfg) in enumerate(zip(prompts, configs, strict=True)):
            rid = ("generate", i, next(self._ids))
            try:
                grammar = constraints[i] if constraints is not None else None
                self.add_request(prompt, cfg, rid, expected_rows=rows, constraint=grammar)
                index[rid] = i
            except S2D2Error as exc:
                results[i] = DecodeOutput(
                    [], GenerationStats(), status="failed", error=_one_line(exc), exception=exc
                )
                if on_finish is not None:
                    on_finish(i, results[i])
        while len(results) < len(prompts) and self.has_unfinished():
            for out in self.step():
                if out.finished and out.request_id in index:
                    i = index.pop(out.request_id)
                    results[i] = out.output
                    if on_finish is not None:
                        on_finish(i, out.output)
        return [results[i] for i in range(len(prompts))]


def decode(
    adapter: ModelAdapter, prompt_ids: Sequence[int] | torch.Tensor, config: DecodeConfig
) -> DecodeOutput:
    """One prompt alone (an engine with one row); errors are raised, not returned."""
    out = LLMEngine(adapter, max_num_seqs=1).generate([prompt_ids], [config])[0]
    if out.exception is not None:
        raise out.exception
    return out

"""Server counters and their Prometheus text exposition (``GET /metrics``).

The engine thread records each step and each finished request; the event loop records what never
reaches the engine (rejected with 429, invalid with 4xx). A lock keeps the two sides consistent.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

#: Request outcomes counted by ``s2d2_requests_total{status=...}``.
STATUSES = ("finished", "aborted", "failed", "rejected", "invalid")
#: Decoding statistics summed over finished requests: the sum's name -> the request's statistic.
FINISHED_SUMS = {
    "finished_tokens": "generated_tokens", "nfe": "nfe", "steps": "steps", "verify_steps": "verify_steps",
    "drafted": "drafted", "accepted": "accepted",
}  # fmt: skip


#: The engine's step-planner counters exposed (``LLMEngine.stats()`` keys), each with its help text.
PLAN_COUNTERS = {
    "plan_rows": "verifications it chose (plan=auto rows)",
    "plan_plain": "plain 2L verifications of the whole span",
    "plan_fused": "fused verifications",
    "plan_prefix": "verifications of the span's first k positions",
    "plan_ar_only": "AR-only steps (one position verified)",
    "plan_degraded_rows": "verifications degraded to AR only by max_num_batched_tokens",
    "plan_deferred_rows": "rows deferred a step by max_num_batched_tokens",
    "plan_block_choices": "requests whose block size was chosen by load (plan_block_sizes)",
    "plan_fixed_choices": "plan=auto requests their load put on plain fixed verification",
}


class ServerMetrics:
    """What ``/metrics`` reports (see :meth:`render`)."""

    def __init__(self, max_num_seqs: int = 1):
        self._lock = threading.Lock()
        self.max_num_seqs = max_num_seqs
        self.requests: Counter[str] = Counter({s: 0 for s in STATUSES})
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        #: :data:`FINISHED_SUMS`, summed
        self.finished: Counter[str] = Counter({name: 0 for name in FINISHED_SUMS})
        #: the engine's counters (``LLMEngine.stats()``: forwards, rows, query tokens, the step planner's
        #: counters, the paged KV memory's), refreshed after every step
        self.engine_counts: dict[str, Any] = {}
        self.running = 0
        self.waiting = 0
        # engine-scope routing statistics (ucb_scope=engine): tables kept, least recently used evicted
        self.routing_tables = 0
        self.routing_evictions = 0

    # ------------------------------------------------------------------ recording
    def record_status(self, status: str) -> None:
        with self._lock:
            self.requests[status] += 1

    def record_tokens(self, n: int) -> None:
        with self._lock:
            self.generation_tokens += n

    def record_finished(self, output: Any, prompt_tokens: int) -> None:
        """A request left the engine (``output``: its DecodeOutput)."""
        s = output.stats
        with self._lock:
            self.requests[output.status] += 1
            self.prompt_tokens += prompt_tokens
            self.cached_prompt_tokens += s.cached_prompt_tokens
            if output.status == "finished":
                for name, stat in FINISHED_SUMS.items():
                    self.finished[name] += getattr(s, stat)

    def record_engine(self, engine: Any) -> None:
        """The engine's state after a step: its counters, its rows, its routing tables."""
        c = engine.stats()
        with self._lock:
            self.engine_counts = c
            self.running, self.waiting = engine.num_running, engine.num_waiting
            self.max_num_seqs = engine.max_num_seqs
            self.routing_tables = len(engine.routing.tables)
            self.routing_evictions = engine.routing.evictions

    # ------------------------------------------------------------------ exposition
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "running": self.running,
                "waiting": self.waiting,
                "forwards": self.engine_counts.get("forwards", 0),
                "generation_tokens": self.generation_tokens,
            }

    def _counters(self) -> list[tuple[str, str, float | int]]:
        e, f = self.engine_counts, self.finished
        return [
            ("s2d2_prompt_tokens_total", "Prompt tokens of requests that ran.", self.prompt_tokens),
            ("s2d2_generation_tokens_total", "Final tokens produced.", self.generation_tokens),
            ("s2d2_forwards_total", "Batched model forwards.", e.get("forwards", 0)),
            ("s2d2_forward_rows_total", "Rows summed over forwards.", e.get("rows", 0)),
            ("s2d2_query_tokens_total", "Query tokens fed to the model.", e.get("query_tokens", 0)),
            ("s2d2_request_nfe_total", "Forwards of finished requests, per row.", f["nfe"]),
            ("s2d2_verify_steps_total", "Verification forwards of finished requests.", f["verify_steps"]),
            ("s2d2_drafted_total", "Draft tokens offered to verification.", f["drafted"]),
            ("s2d2_accepted_total", "Draft tokens accepted by verification.", f["accepted"]),
            *[
                (f"s2d2_{k}_total", f"Step planner: {h}.", e.get(k, 0))
                for k, h in PLAN_COUNTERS.items()
            ],
            (
                "s2d2_routing_table_evictions_total",
                "Engine-scope routing tables evicted (least recently used, past --max-routing-tables).",
                self.routing_evictions,
            ),
            (
                "s2d2_cached_prompt_tokens_total",
                "Prompt positions whose keys and values came from the prefix cache.",
                self.cached_prompt_tokens,
            ),
            ("s2d2_preemptions_total", "Rows preempted to free KV pages.", e.get("preemptions", 0)),
            (
                "s2d2_kv_page_evictions_total",
                "Cached prefix pages evicted (least recently used).",
                e.get("evictions", 0),
            ),
        ]

    def _gauges(self) -> list[tuple[str, str, float | int]]:
        def ratio(a: float, b: float) -> float:
            return float(a / b) if b else 0.0

        e, f = self.engine_counts, self.finished
        mean = ratio(e.get("rows", 0), e.get("forwards", 0) * self.max_num_seqs)
        return [
            (
                "s2d2_nfe_per_token",
                "Forwards per generated token (finished requests).",
                ratio(f["nfe"], f["finished_tokens"]),
            ),
            (
                "s2d2_verification_rate",
                "Share of decoding steps that verified drafts.",
                ratio(f["verify_steps"], f["steps"]),
            ),
            ("s2d2_acceptance_rate", "Share of drafted tokens accepted.", ratio(f["accepted"], f["drafted"])),
            ("s2d2_running_rows", "Rows decoding now.", self.running),
            ("s2d2_waiting_rows", "Requests waiting for a row.", self.waiting),
            ("s2d2_max_num_seqs", "Rows the engine decodes together at most.", self.max_num_seqs),
            ("s2d2_routing_tables", "Engine-scope routing tables kept now.", self.routing_tables),
            (
                "s2d2_batch_occupancy",
                "Running rows / max_num_seqs now.",
                ratio(self.running, self.max_num_seqs),
            ),
            ("s2d2_mean_batch_occupancy", "Rows per forward / max_num_seqs, since start.", mean),
            ("s2d2_kv_pages_used", "KV pages rows hold now.", e.get("kv_pages_used", 0)),
            ("s2d2_kv_pages_free", "KV pages holding nothing.", e.get("kv_pages_free", 0)),
            (
                "s2d2_kv_pages_cached",
                "KV pages no row holds that keep a reusable prefix.",
                e.get("kv_pages_cached", 0),
            ),
            (
                "s2d2_prefix_hit_rate",
                "Prompt positions reused from the prefix cache / prompt positions looked up.",
                float(e.get("prefix_hit_rate", 0.0)),
            ),
        ]

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""

        def fmt(value: float | int) -> str:
            return f"{value:g}" if isinstance(value, float) else str(value)

        with self._lock:
            lines = ["# HELP s2d2_requests_total Requests by outcome.", "# TYPE s2d2_requests_total counter"]
            lines += [f's2d2_requests_total{{status="{s}"}} {self.requests[s]}' for s in STATUSES]
            for kind, series in (("counter", self._counters()), ("gauge", self._gauges())):
                for name, help_, value in series:
                    lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {fmt(value)}"]
        return "\n".join(lines) + "\n"

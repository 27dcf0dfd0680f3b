"""The totals of one configuration's run and the figures of ``results.json`` computed from them.

Definitions (totals over all problems, prefill included): NFE/token = forwards / generated tokens;
syntax error rate (code suites; None otherwise) = programs that do not compile / problems;
tokens/forward = its inverse; verification rate = verification forwards / generated tokens; acceptance
rate = accepted / drafted tokens over verified spans (``None`` where nothing was verified); speed-ups
vs AR are per generated token: AR's NFE/token over the configuration's, and the configuration's
tokens/s over AR's. Wall time is measured around ``model.generate`` (tokenization included).

Diagnostics per run (where the cost goes): ``mean_accepted_per_verification`` (accepted draft tokens
per verification forward, the correction token not counted), ``full_accept_fraction`` (verifications
whose whole span was accepted), ``fallback_commits_per_token`` (tokens S2D2 committed by its baseline
rule, unverified) and ``nfe_per_token_by_kind`` (prefill / draft / verify / commit forwards per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..intervals import wilson_interval
from .grids import BenchConfig


@dataclass
class Totals:
    """Sums over the problems one configuration ran (each problem's seconds as :mod:`.runner` times it)."""

    problems: int = 0
    correct: int = 0
    nfe: int = 0
    nfe_prefill: int = 0
    nfe_draft: int = 0
    nfe_verify: int = 0
    nfe_commit: int = 0
    tokens: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    full_accepts: int = 0
    fallback_commits: int = 0
    query_tokens: int = 0
    predraft_hits: int = 0
    predraft_misses: int = 0
    seconds: float = 0.0
    #: code suites: programs checked for compiling, and those that did not compile
    compile_checked: int = 0
    not_compiling: int = 0

    def add(self, stats: Any, correct: bool, seconds: float, compiles: bool | None = None) -> None:
        """Count one problem: its generation's statistics, whether it was right, its seconds and (code
        suites) whether its program compiles."""
        self.problems += 1
        self.correct += int(correct)
        if compiles is not None:
            self.compile_checked += 1
            self.not_compiling += int(not compiles)
        for k in COUNTERS:
            setattr(self, k, getattr(self, k) + getattr(stats, k))
        self.tokens += stats.generated_tokens
        self.seconds += seconds


#: Counters summed from each generation's statistics into :class:`Totals` (same names).
COUNTERS = (
    "nfe",
    "nfe_prefill",
    "nfe_draft",
    "nfe_verify",
    "nfe_commit",
    "verify_steps",
    "drafted",
    "accepted",
    "fallback_commits",
    "full_accepts",
    "query_tokens",
    "predraft_hits",
    "predraft_misses",
)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _round(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def summarize(cfg: BenchConfig, config: dict[str, Any], t: Totals) -> dict[str, Any]:
    """One run of ``results.json``: ``cfg``'s name and family, its resolved ``config`` and the figures
    of ``t`` (speed-ups left ``None`` for :func:`add_speedups`)."""
    tokens = max(t.tokens, 1)
    lo, hi = wilson_interval(t.correct, t.problems)
    return {
        "name": cfg.name,
        "decoder": cfg.decoder,
        "config": config,
        "accuracy": _round(t.correct / t.problems if t.problems else 0.0),
        "accuracy_ci95": [_round(lo), _round(hi)],
        "nfe_per_token": _round(t.nfe / tokens),
        "syntax_error_rate": _round(_ratio(t.not_compiling, t.compile_checked)),
        "tokens_per_forward": _round(_ratio(t.tokens, t.nfe)),
        "verify_rate": _round(t.nfe_verify / tokens),
        "acceptance_rate": _round(_ratio(t.accepted, t.drafted)),
        "seconds_per_problem": _round(t.seconds / t.problems if t.problems else 0.0),
        "tokens_per_second": _round(_ratio(t.tokens, t.seconds), 3),
        "speedup_nfe_vs_ar": None,
        "speedup_wall_vs_ar": None,
        # diagnostics: where the cost goes
        "mean_accepted_per_verification": _round(_ratio(t.accepted, t.verify_steps)),
        "full_accept_fraction": _round(_ratio(t.full_accepts, t.verify_steps)),
        "fallback_commits_per_token": _round(t.fallback_commits / tokens),
        "query_tokens_per_forward": _round(_ratio(t.query_tokens, t.nfe)),
        "query_tokens_per_token": _round(t.query_tokens / tokens),
        "predraft_hit_rate": _round(_ratio(t.predraft_hits, t.predraft_hits + t.predraft_misses)),
        "nfe_per_token_by_kind": {
            "prefill": _round(t.nfe_prefill / tokens),
            "draft": _round(t.nfe_draft / tokens),
            "verify": _round(t.nfe_verify / tokens),
            "commit": _round(t.nfe_commit / tokens),
        },
    }


def add_speedups(runs: list[dict[str, Any]], totals: list[Totals]) -> None:
    """Fill in each run's speed-ups vs the first AR run, per generated token (none without an AR run)."""
    ar = next((i for i, r in enumerate(runs) if r["decoder"] == "ar"), None)
    if ar is None:
        return
    a = totals[ar]
    ar_nfe_tok = a.nfe / max(a.tokens, 1)
    ar_sec_tok = a.seconds / max(a.tokens, 1)
    for i, (run, t) in enumerate(zip(runs, totals, strict=True)):
        if i == ar:
            run["speedup_nfe_vs_ar"] = run["speedup_wall_vs_ar"] = 1.0
            continue
        nfe_tok = t.nfe / max(t.tokens, 1)
        sec_tok = t.seconds / max(t.tokens, 1)
        run["speedup_nfe_vs_ar"] = _round(_ratio(ar_nfe_tok, nfe_tok), 4)
        run["speedup_wall_vs_ar"] = _round(_ratio(ar_sec_tok, sec_tok), 4)

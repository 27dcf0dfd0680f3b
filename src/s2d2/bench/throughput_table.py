"""The throughput table of ``s2d2 bench-batch``: per (configuration, batch limit) rows from the measured
cells of :func:`~s2d2.bench.throughput.run_throughput` (medians over repeats), and their Markdown rendering.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

from .grids import BenchConfig


def summarize(
    cfgs: list[BenchConfig],
    limits: Sequence[int],
    cells: dict[tuple[int, int, int], list[dict[str, float]]],
    ceiling: float,
    peak_rss_mb: float,
    n: int,
    max_new_tokens: int,
    repeats: int,
    prefix_cache: list[bool],
) -> dict[str, Any]:
    """The result of :func:`~s2d2.bench.throughput.run_throughput` from its measured cells (keyed by limit,
    configuration and prefix-cache setting indices; each a list of repeats)."""
    rows = []
    for j, c in enumerate(cfgs):
        for mi, cache_on in enumerate(prefix_cache):
            rows += _config_rows(
                c, limits, [cells[(li, j, mi)] for li in range(len(limits))], ceiling, cache_on
            )
    return {
        "n": n,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "limits": list(limits),
        "query_ceiling_tokens_per_s": round(ceiling, 1),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def is_auto(c: BenchConfig) -> bool:
    """Whether ``c`` chooses how it decodes by load (``plan="auto"``): what auto / best fixed compares."""
    return c.expanded().get("plan") == "auto"


#: The figures auto / best fixed is given for, where the rows have them: measured tokens/s (the median
#: and the fastest repeat), and on a projection the projected clock with this host's time and the
#: forwards alone.
RATIO_FIGURES = (
    "tokens_per_s",
    "fastest_tokens_per_s",
    "projected_tokens_per_s",
    "projected_forward_tokens_per_s",
)


def auto_vs_best_fixed(rows: list[dict[str, Any]], auto: Sequence[str]) -> list[dict[str, Any]]:
    """For each configuration named in ``auto`` and each batch limit (and prefix-cache setting): its
    figure over the best of the other configurations of the run (those not in ``auto``) at that limit,
    with the best named; one entry per figure of :data:`RATIO_FIGURES` the rows carry."""
    out = []
    for a in (r for r in rows if r["config"] in auto):
        peers = [
            r
            for r in rows
            if r["config"] not in auto
            and (r["max_num_seqs"], r["prefix_cache"]) == (a["max_num_seqs"], a["prefix_cache"])
        ]
        for fig in RATIO_FIGURES:
            have = [r for r in peers if r.get(fig)]
            if not a.get(fig) or not have:
                continue
            best = max(have, key=lambda r: r[fig])
            out.append(
                {
                    "config": a["config"],
                    "max_num_seqs": a["max_num_seqs"],
                    "prefix_cache": a["prefix_cache"],
                    "figure": fig,
                    "auto": a[fig],
                    "best_fixed": best["config"],
                    "best_fixed_value": best[fig],
                    "ratio": round(a[fig] / best[fig], 3),
                }
            )
    return out


def render_ratios(results: dict[str, Any]) -> list[str]:
    """One line per auto configuration and figure: auto / best fixed at every batch limit."""
    lines = []
    seen: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for e in results.get("auto_vs_best_fixed", []):
        seen.setdefault((e["config"], e["figure"], e["prefix_cache"]), []).append(e)
    many_caches = len({k[2] for k in seen}) > 1
    for (name, fig, cache_on), es in seen.items():
        cells = ", ".join(f"{e['max_num_seqs']} rows {e['ratio']:.3f} ({e['best_fixed']})" for e in es)
        where = f", prefix cache {'on' if cache_on else 'off'}" if many_caches else ""
        lines.append(f"{name} / best fixed ({fig}{where}): {cells}")
    return lines


def _config_rows(
    c: BenchConfig, limits: Sequence[int], by_limit: list[list[dict]], ceiling: float, cache_on: bool
) -> list[dict[str, Any]]:
    """One table row per batch limit of configuration ``c`` (one prefix-cache setting)."""
    rows, base = [], None
    for limit, runs in zip(limits, by_limit, strict=True):
        sec = statistics.median(x["seconds"] for x in runs)
        x = runs[0]  # counts are the same in every repeat (greedy, batch invariant)
        tps = x["tokens"] / sec
        base = tps if limit == limits[0] else base
        rows.append(
            {
                "config": c.name,
                "max_num_seqs": limit,
                "tokens_per_s": round(tps, 1),
                # the fastest repeat: background load only slows a cell, so on a shared machine the
                # least disturbed repeat is the steadier figure of the two
                "fastest_tokens_per_s": round(x["tokens"] / min(r["seconds"] for r in runs), 1),
                "speedup_vs_first_limit": round(tps / base, 2),
                "forwards_per_s": round(x["forwards"] / sec, 1),
                "mean_rows_per_forward": round(x["rows"] / x["forwards"], 2),
                "query_tokens_per_forward": round(x["query_tokens"] / x["forwards"], 1),
                "query_tokens_per_s": round(x["query_tokens"] / sec, 1),
                "query_tokens_per_token": round(x["query_tokens"] / x["tokens"], 2),
                "ceiling_fraction": round(x["query_tokens"] / sec / ceiling, 3),
                "seconds": round(sec, 3),
                "tokens": int(x["tokens"]),
                "host_syncs_per_step": round(x["host_syncs_per_step"], 3),
                # step time split, medians over repeats: the model's forward vs everything else
                "forward_ms_per_step": _median(runs, "forward_ms_per_step"),
                "other_ms_per_step": _median(runs, "other_ms_per_step"),
                **_predicted(runs, x),
                **_planned(runs, x),
                "prefix_cache": cache_on,
                "prefill_forwards_per_request": round(x["prefill_forwards_per_request"], 2),
                "prefix_hit_rate": round(x["prefix_hit_rate"], 3),
                "preemptions": int(x["preemptions"]),
                **(_ttft(runs) if "ttft_p50_ms" in x else {}),
            }
        )
    return rows


def _ttft(runs: list[dict[str, float]]) -> dict[str, float]:
    """Time to first token over requests (medians over repeats): p50 and p99 from arrival (at the start,
    or at its Poisson arrival time with a request rate; either way it includes waiting for a row) and
    p50 from admission."""
    return {k: _median(runs, k) for k in ("ttft_p50_ms", "ttft_p99_ms", "ttft_admitted_p50_ms")}


def _predicted(runs: list[dict[str, float]], x: dict[str, float]) -> dict[str, float]:
    """The cost profile's view of a cell: predicted forward ms per step, its median error against the
    measured forwards, and tokens/s on the predicted clock: predicted forwards plus the host time
    measured here (the same Python runs beside a GPU)."""
    if x["predicted_ms_per_step"] is None:
        return {}
    forward = x["predicted_ms_per_step"] * x["steps"] / 1e3
    seconds = forward + _median(runs, "other_ms_per_step") * x["steps"] / 1e3
    return {
        "predicted_ms_per_step": round(x["predicted_ms_per_step"], 4),
        "predicted_abs_error": round(statistics.median(r["predicted_abs_error"] for r in runs), 3),
        "projected_tokens_per_s": round(x["tokens"] / seconds, 1) if seconds > 0 else None,
        # the forwards alone: what the device would do with a host that kept up
        "projected_forward_tokens_per_s": round(x["tokens"] / forward, 1) if forward > 0 else None,
    }


def _planned(runs: list[dict[str, float]], x: dict[str, float]) -> dict[str, float]:
    """A planned configuration (``plan=auto``): the planner's predicted forward ms per planned step
    (``predicted_ms_per_step`` when no cost profile was given: then the planner's own default profile
    predicts), and the planning phase's ms per step (medians over repeats)."""
    fixed = {"plan_fixed_choices": int(x["plan_fixed_choices"])} if x.get("plan_fixed_choices") else {}
    if x.get("plan_admissions"):  # how each request decodes (AR, fixed-B, planned-B), chosen at admission
        fixed["plan_admissions"] = dict(x["plan_admissions"])
    if not x["plan_rows"]:
        return fixed  # every request decoded fixed by its load (engine/plan_regime.py), or none planned
    out = {**fixed, "plan_ms_per_step": _median(runs, "plan_ms_per_step")}
    if x.get("plan_mean_block_size") is not None:  # block sizes chosen by load (plan_block_sizes)
        out["plan_mean_block_size"] = round(x["plan_mean_block_size"], 2)
    out["plan_predicted_ms_per_step"] = round(x["plan_predicted_ms_per_step"], 4)
    if x["predicted_ms_per_step"] is None:
        out["predicted_ms_per_step"] = out["plan_predicted_ms_per_step"]
    return out


def _median(runs: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def render(results: dict[str, Any]) -> str:
    """A Markdown table of :func:`run_throughput`'s result, one line per (configuration, limit)."""
    cols = (
        ("config", "configuration"),
        ("max_num_seqs", "rows"),
        ("tokens_per_s", "tokens/s"),
        ("speedup_vs_first_limit", "x one row"),
        ("forwards_per_s", "forwards/s"),
        ("mean_rows_per_forward", "rows/forward"),
        ("query_tokens_per_token", "query tok/token"),
        ("query_tokens_per_s", "query tok/s"),
        ("ceiling_fraction", "of ceiling"),
        ("forward_ms_per_step", "forward ms/step"),
        ("other_ms_per_step", "other ms/step"),
        ("host_syncs_per_step", "host syncs/step"),
    )
    if len({r["prefix_cache"] for r in results["rows"]}) > 1 or results.get("shared_prefix"):
        cols += (("prefix_cache", "prefix cache"), ("prefill_forwards_per_request", "prefill fwd/request"))
        cols += (("prefix_hit_rate", "prefix hit rate"),)
    if results["rows"] and "ttft_p50_ms" in results["rows"][0]:
        cols += (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"))
        cols += (("ttft_admitted_p50_ms", "TTFT from admission p50 ms"),)
    if results.get("kv_budget_tokens"):
        cols += (("preemptions", "preemptions"),)
    if any("projected_tokens_per_s" in r for r in results["rows"]):  # a cost profile was given
        projected = results.get("projected")
        cols += (
            ("predicted_ms_per_step", "PROJECTED forward ms/step" if projected else "predicted ms/step"),
            ("projected_tokens_per_s", "PROJECTED tokens/s" if projected else "tokens/s, predicted"),
        )
        if not projected:
            cols += (("predicted_abs_error", "predicted vs measured (median error)"),)
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in results["rows"]:  # a cell without a column's value (a planned row's own profile): "-"
        lines.append("| " + " | ".join(str(r.get(k, "-")) for k, _ in cols) + " |")
    lines.append("")
    lines += render_ratios(results)
    lines.append(
        f"query-token ceiling {results['query_ceiling_tokens_per_s']:.0f} tokens/s (one packed forward); "
        f"peak RSS {results['peak_rss_mb']:.0f} MB; {results['n']} problems, "
        f"{results['threads']} threads, median of {results['repeats']}"
    )
    if results.get("request_rate") is not None:
        lines.append(
            f"requests arrive as a Poisson process at {results['request_rate']:g}/s (seeded, the same in "
            "every cell): TTFT is from arrival, and tokens/s is bound by the arrivals"
        )
    if results.get("projected"):
        lines.append(
            f"PROJECTED: every step charged the time {results['projected']} predicts for the step the "
            "projected model would run (plus the host time measured here); tokens are the built-in model's."
        )
    return "\n".join(lines)

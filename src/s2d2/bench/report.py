"""The report of a bench run: its Markdown table, its accuracy-vs-cost plots and the files holding them.

:func:`pareto_frontier` (the statistic the plots draw) is also what ``s2d2 tune`` ranks trials by.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import S2D2Error
from .grids import FAMILIES
from .outdir import prepare_out_dir


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the ``(cost, accuracy)`` points no other point beats (cost no higher and accuracy no
    lower, one of them strictly), sorted by cost. Of identical points the first is kept; points with a
    missing or NaN coordinate are ignored."""
    valid = [
        i
        for i, (c, a) in enumerate(points)
        if c is not None and a is not None and not (math.isnan(c) or math.isnan(a))
    ]
    order = sorted(valid, key=lambda i: (points[i][0], -points[i][1], i))
    out: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            out.append(i)
            best = points[i][1]
    return out


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise S2D2Error("plots need matplotlib: pip install matplotlib") from None


# ---------------------------------------------------------------------------------------------- table

TABLE_COLUMNS = (
    "configuration",
    "accuracy (95% CI)",
    "NFE/token",
    "tokens/forward",
    "verification rate",
    "acceptance rate",
    "query tokens/forward",
    "pre-draft hit rate",
    "s/problem",
    "tokens/s",
    "speed-up vs AR (NFE)",
    "speed-up vs AR (wall)",
)


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in results["runs"]:
        lo, hi = r["accuracy_ci95"]
        rows.append(
            [
                r["name"],
                f"{r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]",
                _fmt(r["nfe_per_token"], ".3f"),
                _fmt(r["tokens_per_forward"], ".2f"),
                _fmt(r["verify_rate"], ".3f"),
                _fmt(r["acceptance_rate"], ".3f"),
                _fmt(r.get("query_tokens_per_forward"), ".1f"),
                _fmt(r.get("predraft_hit_rate"), ".3f"),
                _fmt(r["seconds_per_problem"], ".4f"),
                _fmt(r["tokens_per_second"], ".1f"),
                _fmt(r["speedup_nfe_vs_ar"], ".2f", "x"),
                _fmt(r["speedup_wall_vs_ar"], ".2f", "x"),
            ]
        )
    return rows


def render_table(results: dict[str, Any]) -> str:
    """A Markdown table with one row per configuration and every column of :data:`TABLE_COLUMNS`."""
    rows = table_rows(results)
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(TABLE_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    sep = "|" + "|".join("-" * (w + 1) + (":" if k else "-") for k, w in enumerate(widths)) + "|"
    title = (
        f"{results.get('model', '')} on {results.get('suite', '')} {results.get('split', '')}, "
        f"n={results.get('n', '')} (speed-ups per generated token)"
    )
    batch = results.get("max_num_seqs", 1)
    if isinstance(batch, int) and batch > 1:
        title += f"; batches of {batch}: s/problem and tokens/s are the throughput of {batch} rows"
    return "\n".join([title, "", line(TABLE_COLUMNS), sep, *(line(r) for r in rows)]) + "\n"


# ---------------------------------------------------------------------------------------------- plots

_STYLE = {
    "ar": ("black", "*"),
    "static": ("tab:gray", "s"),
    "dynamic": ("tab:blue", "o"),
    "eb": ("tab:green", "^"),
    "s2d2": ("tab:red", "D"),
}

#: The plots: the run field on the x axis, its label and the PNG's file name.
_PLOTS = (
    ("nfe_per_token", "NFE per generated token (lower is faster)", "accuracy_vs_nfe.png"),
    ("seconds_per_problem", "wall time per problem, s (lower is faster)", "accuracy_vs_wall.png"),
)


def plot_results(results: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Accuracy vs NFE/token and accuracy vs s/problem, one colour per decoder family with its Pareto
    frontier drawn; returns the two PNG paths."""
    require_matplotlib()
    out = Path(out_dir)
    paths = []
    for key, xlabel, fname in _PLOTS:
        path = out / fname
        _plot_accuracy_vs(results, key, xlabel, path)
        paths.append(path)
    return paths


def _plot_accuracy_vs(results: dict[str, Any], key: str, xlabel: str, path: Path) -> None:
    """Write one PNG: accuracy vs the runs' ``key``, one series per decoder family."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = results["runs"]
    fig = Figure(figsize=(9, 6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ar = [r for r in runs if r["decoder"] == "ar"]
    if ar:
        ax.axhline(float(ar[0]["accuracy"]), color="black", ls=":", lw=0.8, alpha=0.6)
    for fam in FAMILIES:
        rs = [r for r in runs if r["decoder"] == fam and r[key] is not None]
        if rs:
            _plot_family(ax, fam, rs, key)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (95% Wilson CI)")
    ax.set_title(
        f"{results.get('model', '')}: {results.get('suite', '')} {results.get('split', '')}, "
        f"n={results.get('n', '')} (lines: Pareto frontier per decoder)",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _plot_family(ax: Any, fam: str, rs: list[dict[str, Any]], key: str) -> None:
    """One decoder family's runs on ``ax``: points, CI error bars, and its Pareto frontier, named."""
    color, marker = _STYLE[fam]
    xs = [float(r[key]) for r in rs]
    ys = [float(r["accuracy"]) for r in rs]
    err = [
        [y - r["accuracy_ci95"][0] for y, r in zip(ys, rs, strict=True)],
        [r["accuracy_ci95"][1] - y for y, r in zip(ys, rs, strict=True)],
    ]
    ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=color, alpha=0.25, lw=0.8)
    big = fam == "ar"
    ax.scatter(
        xs,
        ys,
        c=color,
        marker=marker,
        s=120 if big else 40,
        label=fam,
        alpha=0.85,
        zorder=4 if big else 3,
    )
    front = pareto_frontier(list(zip(xs, ys, strict=True)))
    if len(front) > 1:
        ax.plot([xs[i] for i in front], [ys[i] for i in front], color=color, lw=1.5, alpha=0.8)
    for i in front:
        ax.annotate(rs[i]["name"], (xs[i], ys[i]), fontsize=6, xytext=(3, 3), textcoords="offset points")


# ---------------------------------------------------------------------------------------------- files


def write_results(results: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``results.json``, ``table.md`` and the plots into ``out_dir`` (only those files)."""
    out = prepare_out_dir(out_dir)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "table.md").write_text(render_table(results), encoding="utf-8")
    return [out / "results.json", out / "table.md", *plot_results(results, out)]

"""What ``s2d2 tune`` writes next to its preset: a plot of every trial and a markdown table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .choice import TrialPoint, accuracy_floor, pareto_numbers

#: Settings shown in the table's "settings" column, in this order (others are left out for width).
_SHOWN = (
    "block_size",
    "policy",
    "causal_cache",
    "estimator",
    "score",
    "penalty",
    "score_threshold",
    "hysteresis_on",
    "hysteresis_off",
    "min_span",
    "ucb_scope",
    "ucb_reward",
    "ucb_entropy_scale",
    "fallback",
    "threshold",
    "gamma",
    "acceptance",
)


def report_paths(preset_path: str | Path) -> tuple[Path, Path]:
    """The plot and table paths next to ``PRESET.json``: ``PRESET.png`` and ``PRESET.md``."""
    p = Path(preset_path)
    return p.with_suffix(".png"), p.with_suffix(".md")


def _short(settings: dict[str, Any]) -> str:
    parts = []
    for k in _SHOWN:
        if k in settings and settings[k] is not None:
            v = settings[k]
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def render_table(points: list[TrialPoint], chosen: int, ar: dict[str, Any], floor: float) -> str:
    """Markdown: AR, then every trial by NFE/token (Pareto-front and chosen trials marked)."""
    front = pareto_numbers(points)
    lines = [
        f"Accuracy floor (AR minus max drop): {floor:.4f}. `*` = Pareto front, `<-` = chosen.",
        "",
        "| trial | accuracy | NFE/token | s/problem | verify/token | accept rate | | settings |",
        "|---|---|---|---|---|---|---|---|",
        f"| AR | {ar['accuracy']:.4f} | {ar['nfe_per_token']:.4f} | {ar['seconds_per_problem']:.4f} "
        "| 0 | - | | decoder=ar |",
    ]
    for p in sorted(points, key=lambda p: (p.nfe_per_token, -p.accuracy, p.number)):
        f = p.figures
        mark = ("*" if p.number in front else "") + (" <-" if p.number == chosen else "")
        lines.append(
            f"| {p.number} | {p.accuracy:.4f} | {p.nfe_per_token:.4f} | {p.seconds_per_problem:.4f} "
            f"| {f.get('verify_rate', 0):.4f} | {f.get('acceptance_rate', 0):.3f} | {mark.strip()} "
            f"| {_short(p.settings)} |"
        )
    return "\n".join(lines) + "\n"


def plot_trials(
    points: list[TrialPoint], chosen: int, ar: dict[str, Any], max_drop: float, path: str | Path
) -> Path:
    """Accuracy vs NFE/token of every trial; the Pareto front as a line, the chosen trial and AR marked,
    the accuracy floor as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = sorted((p for p in points if p.number in pareto_numbers(points)), key=lambda p: p.nfe_per_token)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.scatter(
        [p.nfe_per_token for p in points], [p.accuracy for p in points], s=18, c="#8aa", label="trials"
    )
    ax.plot(
        [p.nfe_per_token for p in front],
        [p.accuracy for p in front],
        "-o",
        c="#1f77b4",
        ms=4,
        label="Pareto front",
    )
    best = next(p for p in points if p.number == chosen)
    ax.scatter([best.nfe_per_token], [best.accuracy], marker="*", s=220, c="#d62728", zorder=5,
               label=f"chosen (trial {chosen})")  # fmt: skip
    ax.scatter([ar["nfe_per_token"]], [ar["accuracy"]], marker="s", s=50, c="k", label="AR")
    ax.axhline(accuracy_floor(ar["accuracy"], max_drop), ls="--", c="#999", lw=1, label=f"AR - {max_drop:g}")
    ax.set_xlabel("NFE per generated token (lower is faster)")
    ax.set_ylabel("accuracy (dev)")
    ax.set_title(f"s2d2 tune: {len(points)} trials")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def write_report(
    points: list[TrialPoint], chosen: int, ar: dict[str, Any], max_drop: float, preset_path: str | Path
) -> tuple[Path, Path]:
    """Write ``PRESET.png`` and ``PRESET.md`` next to the preset; returns their paths."""
    png, md = report_paths(preset_path)
    plot_trials(points, chosen, ar, max_drop, png)
    md.write_text(
        f"# s2d2 tune: {Path(preset_path).name}\n\n"
        + render_table(points, chosen, ar, accuracy_floor(ar["accuracy"], max_drop)),
        encoding="utf-8",
    )
    return png, md


__all__ = ["plot_trials", "render_table", "report_paths", "write_report"]

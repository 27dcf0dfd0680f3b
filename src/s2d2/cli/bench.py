"""``s2d2 bench``: the command over :mod:`s2d2.bench` (grids, runs, tables and plots live there)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..bench.grid_run import run_bench
from ..bench.grids import GRIDS, BenchConfig, get_grid
from ..bench.outdir import OUTPUT_FILES, check_out_dir
from ..bench.report import render_table, require_matplotlib
from ..bench.suites import SUITES, load_problems
from ..errors import S2D2Error
from .options import (
    DeviceFlags,
    MaxNewOpt,
    ModelOpt,
    ParallelFlags,
    ProgressOpt,
    RevisionOpt,
    ThreadsOpt,
    check_at_least,
    check_max_num_seqs,
    load_model,
    option_groups,
)

SuiteOpt = Annotated[str, typer.Option(help="Benchmark suite: tiny-gsm | tiny-code.")]
SplitOpt = Annotated[str, typer.Option(help="Split of the suite: test | dev.")]
NOpt = Annotated[
    int | None, typer.Option("--n", help="Number of problems (the split's first N; default: all).")
]
GridOpt = Annotated[str, typer.Option(help=f"Configurations to run: {' | '.join(GRIDS)}.")]
BenchPresetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--preset",
        help="Also run this preset (a name or a PRESET.json file, e.g. from s2d2 tune) as one more row, "
        "named after it. Repeatable.",
    ),
]
OutOpt = Annotated[Path | None, typer.Option(help="Output directory (default: runs/bench-GRID).")]
BenchNumSeqsOpt = Annotated[
    int,
    typer.Option(
        "--max-num-seqs",
        help="Problems decoded together: each configuration runs on chunks of N problems as one batch on "
        "the batched engine (s/problem is then the batch's wall time / N, tokens/s the throughput of N "
        "rows); 1 runs them one at a time (interleaved, per-problem timing). Accuracy and NFE stay the same.",
    ),
]


@option_groups
def bench_command(
    *,
    model: ModelOpt = "tiny-gsm",
    suite: SuiteOpt = "tiny-gsm",
    split: SplitOpt = "test",
    n: NOpt = None,
    grid: GridOpt = "default",
    preset: BenchPresetOpt = None,
    out: OutOpt = None,
    threads: ThreadsOpt = None,
    max_new_tokens: MaxNewOpt = None,
    max_num_seqs: BenchNumSeqsOpt = 16,
    progress: ProgressOpt = True,
    placement: DeviceFlags,
    revision: RevisionOpt = None,
    parallel: ParallelFlags,
) -> None:
    """Run a grid of decoding configurations over the same N problems, interleaved problem by problem
    (or chunk by chunk with --max-num-seqs); print a table and write results.json, problems.jsonl,
    table.md and accuracy-vs-cost plots to OUT. Rows are decoded over the library's defaults, not over a
    checkpoint's own s2d2_preset.json (give it with --preset to add it as a row)."""
    configs = get_grid(grid) + preset_rows(preset)
    problems = load_problems(suite, split, n)
    check_at_least("--threads", threads, 1)
    check_at_least("--max-new-tokens", max_new_tokens, 1)
    check_max_num_seqs(max_num_seqs)
    out_dir = check_out_dir(out if out is not None else Path("runs") / f"bench-{grid}")
    require_matplotlib()
    m = _load_model(
        model, placement, threads=threads, max_num_seqs=max_num_seqs, revision=revision,
        **parallel.load_options(),
    )
    results = run_bench(
        m,
        problems,
        configs,
        max_new_tokens=max_new_tokens or SUITES[suite]["max_new_tokens"],
        suite=suite,
        split=split,
        model_name=model,
        out_dir=out_dir,
        progress=progress,
        max_num_seqs=max_num_seqs,
    )
    typer.echo(render_table(results))
    typer.echo(f"wrote {', '.join(OUTPUT_FILES)} to {out_dir}", err=True)


def _load_model(model: str, placement: DeviceFlags, **options: Any) -> Any:
    """``model`` without its own s2d2_preset.json (``options``: ``load_model``'s keywords); any loading
    failure becomes one line."""
    try:
        return load_model(model, placement, freeze=True, use_preset=False, **options)
    except S2D2Error:
        raise
    except Exception as exc:  # a broken checkpoint can fail in many ways; the user needs one line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise S2D2Error(f"cannot load model {model}: {msg}") from None


def preset_rows(presets: list[str] | None) -> list[BenchConfig]:
    """One bench row per ``--preset``: named after the preset file's ``name`` (or the preset's name)."""
    from ..config import preset_settings
    from ..presets import PRESETS, read_preset_file

    rows = []
    for value in presets or []:
        preset_settings(value)  # an unknown name or a bad file fails here, before the model loads
        name = value if value in PRESETS else read_preset_file(value).name
        rows.append(BenchConfig(name, {"preset": value}))
    return rows

"""``s2d2 bench``: the command over :mod:`s2d2.bench` (grids, runs, tables and plots live there)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .. import bench
from ..errors import S2D2Error
from .options import DeviceOpt, DtypeOpt, MaxNewOpt, ModelOpt, ProgressOpt

SuiteOpt = Annotated[str, typer.Option(help="Benchmark suite: tiny-gsm.")]
SplitOpt = Annotated[str, typer.Option(help="Split of the suite: test | dev.")]
NOpt = Annotated[
    int | None, typer.Option("--n", help="Number of problems (the split's first N; default: all).")
]
GridOpt = Annotated[str, typer.Option(help="Configurations to run: default | paper | quick.")]
OutOpt = Annotated[Path | None, typer.Option(help="Output directory (default: runs/bench-GRID).")]
ThreadsOpt = Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's own choice).")]


def bench_command(
    model: ModelOpt = "tiny-gsm",
    suite: SuiteOpt = "tiny-gsm",
    split: SplitOpt = "test",
    n: NOpt = None,
    grid: GridOpt = "default",
    out: OutOpt = None,
    threads: ThreadsOpt = None,
    max_new_tokens: MaxNewOpt = None,
    progress: ProgressOpt = True,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Run a grid of decoding configurations over the same N problems, interleaved problem by problem;
    print a table and write results.json, problems.jsonl, table.md and accuracy-vs-cost plots to OUT."""
    configs = bench.get_grid(grid)
    problems = bench.load_problems(suite, split, n)
    if threads is not None and threads < 1:
        raise S2D2Error(f"--threads must be >= 1, got {threads}")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise S2D2Error(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    out_dir = bench.check_out_dir(out if out is not None else Path("runs") / f"bench-{grid}")
    bench.require_matplotlib()
    m = _load_model(model, device=device, dtype=dtype, threads=threads)
    results = bench.run_bench(
        m,
        problems,
        configs,
        max_new_tokens=max_new_tokens or bench.SUITES[suite]["max_new_tokens"],
        suite=suite,
        split=split,
        model_name=model,
        out_dir=out_dir,
        progress=progress,
    )
    typer.echo(bench.render_table(results))
    typer.echo(f"wrote {', '.join(bench.OUTPUT_FILES)} to {out_dir}", err=True)


def _load_model(model: str, *, device: str | None, dtype: str | None, threads: int | None) -> Any:
    """Set torch's thread count and load ``model``; any loading failure becomes one line."""
    import torch

    from ..model import load

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return load(model, device=device, dtype=dtype)
    except S2D2Error:
        raise
    except Exception as exc:  # a broken checkpoint can fail in many ways; the user needs one line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise S2D2Error(f"cannot load model {model}: {msg}") from None

"""``s2d2 tune``: search S2D2's settings on a dev set and write the fastest preset within AR's accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import S2D2Error
from .options import (
    DeviceFlags,
    MaxNewOpt,
    ModelOpt,
    ProgressOpt,
    RevisionOpt,
    ThreadsOpt,
    check_at_least,
    check_max_num_seqs,
    load_model,
    option_groups,
    require_modules,
)

TASKS = ("tiny-gsm", "gsm8k")

TaskOpt = Annotated[str, typer.Option(help="tiny-gsm (built-in splits, or --data) | gsm8k (needs --data).")]
DataOpt = Annotated[Path | None, typer.Option(help="JSONL problems (question + answer/final).")]
SplitOpt = Annotated[str, typer.Option(help="Split of the built-in tiny-gsm data: dev | test.")]
NOpt = Annotated[int | None, typer.Option("--n", help="Tune on the first N problems (default: all).")]
MaxDropOpt = Annotated[
    float, typer.Option(help="Accuracy the chosen preset may lose against AR (a fraction: 0.01 = 1 point).")
]
TrialsOpt = Annotated[int, typer.Option(help="Trials to run in this invocation (a resumed study adds them).")]
BudgetOpt = Annotated[
    float | None, typer.Option("--time-budget", help="Stop starting trials after this many minutes.")
]
StorageOpt = Annotated[
    str | None,
    typer.Option(help="Optuna storage URL, e.g. sqlite:///tune.db; the same study resumes from it."),
]
OutArg = Annotated[Path, typer.Option("--out", help="The preset file to write (PRESET.json).")]
NameOpt = Annotated[str | None, typer.Option(help="The preset's name (default: tuned-TASK-MODEL).")]
SeqsOpt = Annotated[int, typer.Option("--max-num-seqs", help="Rows each trial decodes together.")]
WallOpt = Annotated[bool, typer.Option("--wall-time", help="Add seconds per problem as a third objective.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the sampler.")]


@option_groups
def tune_command(
    out: OutArg,
    *,
    model: ModelOpt = "tiny-gsm",
    task: TaskOpt = "tiny-gsm",
    data: DataOpt = None,
    split: SplitOpt = "dev",
    n: NOpt = None,
    max_drop: MaxDropOpt = 0.01,
    trials: TrialsOpt = 40,
    time_budget: BudgetOpt = None,
    storage: StorageOpt = None,
    name: NameOpt = None,
    max_num_seqs: SeqsOpt = 64,
    max_new_tokens: MaxNewOpt = None,
    wall_time: WallOpt = False,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    progress: ProgressOpt = True,
    placement: DeviceFlags,
    revision: RevisionOpt = None,
) -> None:
    """Tune S2D2's settings (block size, causal cache, routing policy and parameters, estimator, score,
    fallback, acceptance) on dev problems with Optuna: AR runs once, every trial decodes the problems as
    one batch; writes OUT (the fastest trial within --max-drop of AR's accuracy), OUT.png (every trial,
    the Pareto front and the chosen one) and OUT.md (a table). Use the preset with --preset OUT."""
    _check(out, max_drop, trials, time_budget, max_num_seqs, n, max_new_tokens)
    from ..tuning.study import TuneSpec

    spec = TuneSpec(
        model=model,
        task=task,
        split=split,
        n=n,
        data=str(data) if data else None,
        max_drop=max_drop,
        trials=trials,
        time_budget_min=time_budget,
        storage=storage,
        wall_time=wall_time,
        seed=seed,
    )
    require_modules("optuna", hint="s2d2 tune needs Optuna: pip install 's2d2[tune]' (or pip install optuna)")
    problems, task_obj = load_dev_problems(task, split, n, data)
    # without the model's own s2d2_preset.json: trials set every searched setting themselves
    m = load_model(
        model, placement, threads=threads, max_num_seqs=max_num_seqs, use_preset=False, revision=revision
    )
    from ..tuning.trial_eval import DevSet

    dev = DevSet(problems, task_obj, max_new_tokens or task_obj.max_new_tokens, task_obj.default_chat(m))
    run_and_write(m, dev, spec, out, name=name, progress=progress)


def _check(
    out: Path, max_drop: float, trials: int, budget: float | None, seqs: int, n: Any, mnt: Any
) -> None:
    if out.suffix != ".json":
        raise S2D2Error(f"--out must be a .json file, got {out}")
    if out.is_dir():
        raise S2D2Error(f"--out {out} is a directory")
    if not 0.0 <= max_drop <= 1.0:
        raise S2D2Error(f"--max-drop must be in [0, 1] (a fraction of accuracy), got {max_drop}")
    check_at_least("--trials", trials, 1)
    if budget is not None and not budget > 0:
        raise S2D2Error(f"--time-budget must be > 0 minutes, got {budget}")
    check_max_num_seqs(seqs)
    check_at_least("--n", n, 1)
    check_at_least("--max-new-tokens", mnt, 1)


def load_dev_problems(task: str, split: str, n: int | None, data: Path | None) -> tuple[list[dict], Any]:
    """The problems to tune on and their task (prompting, scoring, default length)."""
    from ..evaluation.tasks import get_task

    if task not in TASKS:
        raise S2D2Error(f"unknown --task {task!r}; choose one of: {', '.join(TASKS)}")
    task_obj = get_task(task)
    if data is not None:
        return task_obj.load(data, limit=n), task_obj
    if task == "gsm8k":
        raise S2D2Error("--task gsm8k needs --data FILE.jsonl (its dev problems)")
    from ..bench.suites import load_problems

    return load_problems("tiny-gsm", split, n), task_obj


def run_and_write(m: Any, dev: Any, spec: Any, out: Path, *, name: str | None, progress: bool) -> None:
    """Run the study, then write the preset, its plot and its table; print a summary."""
    from ..presets import write_preset_file
    from ..tuning.study import run_tune
    from ..tuning.trial_report import write_report

    result = run_tune(m, dev, spec, progress=progress)
    if name is not None:
        result.preset.name = name
    write_preset_file(result.preset, out)
    png, md = write_report(result.points, result.chosen.number, result.ar.to_dict(), spec.max_drop, out)
    for note in result.notes:
        typer.echo(f"warning: {note}", err=True)
    c, ar = result.chosen, result.ar
    typer.echo(
        f"chosen trial {c.number} of {len(result.points)}: accuracy {c.accuracy:.4f} at "
        f"{c.nfe_per_token:.4f} NFE/token (AR: {ar.accuracy:.4f} at {ar.nfe_per_token:.4f}); "
        f"{result.new_trials} new trials in {result.seconds:.1f} s"
    )
    typer.echo(f"wrote {out}, {png}, {md}", err=True)

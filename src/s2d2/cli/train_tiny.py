"""``s2d2 train-tiny``: train a built-in tiny model (tiny-gsm or tiny-code) from scratch on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import S2D2Error
from .options import check_above, check_at_least, checked_option

DEFAULT_TRAIN_STEPS = 4400  # keep in step with src/s2d2/models/tiny-gsm/MODEL_CARD.md

StepsCapOpt = Annotated[
    int,
    typer.Option(help="Optimiser-step cap (on 2 cores the 60-minute cap ends first, at about 3,100)."),
]
MinutesOpt = Annotated[
    float, typer.Option(help="Wall-clock cap in minutes (evaluations included); first to end wins.")
]
OutDirOpt = Annotated[Path, typer.Option(help="Output directory (checkpoints, logs, best/).")]
SeedOpt = Annotated[int, typer.Option(help="Random seed.")]
ResumeOpt = Annotated[bool, typer.Option(help="Resume from OUT/ckpt.pt if present.")]
DevSizeOpt = Annotated[
    int, typer.Option(help="Dev problems decoded per evaluation (checkpoint selection; >= 500 advised).")
]
EvalEveryOpt = Annotated[float, typer.Option(help="Minutes between dev evaluations.")]
BlockMixOpt = Annotated[
    str | None,
    typer.Option(
        help="Block sizes to train and their weights as B=WEIGHT,... (e.g. '1=1' for AR mode only; "
        "default: the shipped recipe 2=.1,4=.3,8=.35,16=.25)."
    ),
]
ArFirstOpt = Annotated[
    float | None,
    typer.Option(
        help="Fraction of the budget trained in AR mode only (block size 1) before the block mix "
        "starts (default 0.5, the shipped recipe; 0 = mix from the start; a resumed run keeps its "
        "own value unless given)."
    ),
]
CompileOpt = Annotated[
    bool,
    typer.Option(
        help="Train through torch.compile: 3-6% more steps per minute in a 60-minute run on 2 CPU "
        "cores, after a warm-up of about 2 minutes that counts against the budget (a wash at 60 "
        "minutes); falls back to eager if compilation fails."
    ),
]
LrOpt = Annotated[
    float | None,
    typer.Option(
        help="Peak learning rate of the warm-up + cosine schedule (default 2e-3, the shipped recipe; "
        "a resumed run keeps its own unless given)."
    ),
]
EmaOpt = Annotated[
    float | None,
    typer.Option(
        help="Decay of an exponential moving average of the weights, which is then what gets "
        "evaluated and saved to OUT/best (default 0.995, the shipped recipe; 0 = off, evaluate the live "
        "weights; a resumed run keeps its own unless given)."
    ),
]
HardFocusOpt = Annotated[
    float | None,
    typer.Option(
        help="In [0, 1): thin out training problems whose additions and subtractions carry or borrow "
        "in fewer than two digit columns (kept with probability 1 - F for none, 1 - F/2 for one), so "
        "that the steps the model gets wrong most are seen more (default 0.6, the shipped recipe; "
        "0 = the natural distribution, as the test split has it; a resumed run keeps its own unless "
        "given)."
    ),
]
TaskOpt = Annotated[str, typer.Option(help="Which built-in model to train: tiny-gsm | tiny-code.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(help="A fixed intra-op thread count (default: 1 or 2, whichever is measured faster)."),
]


def train_tiny_command(
    steps: StepsCapOpt = DEFAULT_TRAIN_STEPS,
    minutes: MinutesOpt = 60.0,
    out: OutDirOpt = Path("runs/tiny-gsm"),
    seed: SeedOpt = 0,
    resume: ResumeOpt = True,
    dev_size: DevSizeOpt = 500,
    eval_every: EvalEveryOpt = 7.0,
    block_mix: BlockMixOpt = None,
    ar_first: ArFirstOpt = None,
    compile: CompileOpt = False,
    lr: LrOpt = None,
    ema: EmaOpt = None,
    hard_focus: HardFocusOpt = None,
    task: TaskOpt = "tiny-gsm",
    threads: ThreadsOpt = None,
) -> None:
    """Train a built-in tiny model from scratch (CPU; tiny-gsm, or tiny-code with --task tiny-code); the
    selected model lands in OUT/best/.

    Stops after STEPS optimiser steps or MINUTES of wall-clock time, whichever comes first; a killed run
    resumes from OUT/ckpt.pt. Evaluates greedy AR and dynamic B=8 decoding on DEV_SIZE dev problems and
    keeps the checkpoint with the best sum of the two accuracies.
    """
    from ..tasks.tiny_gsm.curriculum import check_hard_focus
    from ..training.ema import check_ema
    from ..training.loop import train_tiny
    from ..training.schedule import check_ar_first, check_lr, parse_block_mix

    check_above("--minutes", minutes, 0)
    check_at_least("--steps", steps, 1)
    if dev_size < 1 or eval_every <= 0:
        raise S2D2Error("--dev-size must be >= 1 and --eval-every > 0")
    if task not in ("tiny-gsm", "tiny-code"):
        raise S2D2Error(f"--task must be tiny-gsm or tiny-code, got {task!r}")
    check_at_least("--threads", threads, 1)
    if out.exists() and not out.is_dir():
        raise S2D2Error(f"--out {out} exists and is not a directory")
    best = train_tiny(
        minutes=minutes,
        out=out,
        seed=seed,
        steps=steps,
        resume=resume,
        dev_size=dev_size,
        eval_every_minutes=eval_every,
        block_mix=checked_option("--block-mix", parse_block_mix, block_mix),
        ar_first=checked_option("--ar-first", check_ar_first, ar_first),
        compile=compile,
        lr=checked_option("--lr", check_lr, lr),
        ema=checked_option("--ema", check_ema, ema),
        hard_focus=checked_option("--hard-focus", check_hard_focus, hard_focus),
        task=task,
        threads=threads,
    )
    typer.echo(f"best model: {best}")

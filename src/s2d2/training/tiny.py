"""``python -m s2d2.training.tiny``: train a built-in block-diffusion model (``tiny-gsm``, or ``tiny-code``
with ``--task tiny-code``) on CPU (a Qwen3 network saved in SDAR format). Same options as ``s2d2 train-tiny``.

The code lives in the modules next to this one: :mod:`~s2d2.training.loop` (:func:`train_tiny`: budget,
resume, evaluation and model selection), :mod:`~s2d2.training.batches` (the training objective),
:mod:`~s2d2.training.schedule` (block mix, AR-only phase, learning rate), :mod:`~s2d2.training.options`
(a run's settings), :mod:`~s2d2.training.ema` (weight average), :mod:`~s2d2.training.dev_eval` (dev
decoding), :mod:`~s2d2.training.model_io` (network and SDAR directories) and
:mod:`~s2d2.training.threads` (thread count).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from s2d2.tasks.tiny_gsm.curriculum import check_hard_focus
from s2d2.training.ema import EMA_DECAY, check_ema
from s2d2.training.loop import train_tiny
from s2d2.training.options import HARD_FOCUS
from s2d2.training.schedule import LR, check_ar_first, check_lr, parse_block_mix

__all__ = ["main"]


def _checked(check, convert=float):
    """An argparse ``type``: ``convert(text)`` passed through ``check``; a ValueError from either becomes
    the usage error (one line, no traceback)."""

    def parse(text: str):
        try:
            return check(convert(text))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train a built-in tiny block-diffusion model (CPU).")
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock budget, evaluations included")
    ap.add_argument("--steps", type=int, default=None, help="optimiser-step budget (first to end wins)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--eval-every", type=float, default=7.0, help="minutes between dev evaluations")
    ap.add_argument("--eval-start", type=float, default=0.4, help="fraction of the budget before evaluating")
    ap.add_argument("--dev-size", type=int, default=500)
    ap.add_argument(
        "--block-mix", type=_checked(parse_block_mix, str), default=None, help="B=WEIGHT,... (see BLOCK_MIX)"
    )
    ap.add_argument(
        "--ar-first",
        type=_checked(check_ar_first),
        default=None,
        help="fraction of the budget in AR mode only",
    )
    ap.add_argument("--task", choices=("tiny-gsm", "tiny-code"), default="tiny-gsm", help="built-in model")
    ap.add_argument("--threads", type=int, default=None, help="fixed thread count")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--compile", action="store_true", help="train through torch.compile")
    ap.add_argument("--lr", type=_checked(check_lr), default=None, help=f"peak learning rate (default {LR})")
    ap.add_argument(
        "--ema", type=_checked(check_ema), default=None, help=f"weight-average decay (default {EMA_DECAY})"
    )
    ap.add_argument(
        "--hard-focus",
        type=_checked(check_hard_focus),
        default=None,
        help=f"thin out problems without carries/borrows, in [0, 1) (default {HARD_FOCUS}; 0 = natural)",
    )
    a = ap.parse_args(argv)
    best = train_tiny(
        a.minutes,
        a.out,
        seed=a.seed,
        steps=a.steps,
        resume=not a.no_resume,
        eval_every_minutes=a.eval_every,
        dev_size=a.dev_size,
        progress=not a.no_progress,
        eval_start_fraction=a.eval_start,
        block_mix=a.block_mix,
        ar_first=a.ar_first,
        compile=a.compile,
        lr=a.lr,
        ema=a.ema,
        hard_focus=a.hard_focus,
        task=a.task,
        threads=a.threads,
    )
    print(f"best model: {best}")


if __name__ == "__main__":
    main()

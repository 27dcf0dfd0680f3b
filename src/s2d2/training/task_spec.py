"""What the tiny-model trainer needs from a task: :class:`TrainTask`, and the two built-in ones.

:func:`s2d2.training.loop.train_tiny` trains either built-in model with the same objective, schedule and
model selection; a task supplies its tokenizer, its training stream, its dev problems, how a dev
completion is scored (no code is run during training) and the settings that differ between tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["TRAIN_TASKS", "TrainTask", "train_task"]


@dataclass(frozen=True)
class TrainTask:
    """One task the tiny-model trainer can train on.

    ``build_tokenizer(None)`` returns the tokenizer; ``tokenizer_dir()`` holds its committed files
    (copied into every saved model); ``iter_train(seed, start, hard_focus)`` is the endless training
    stream of ``{"question", "answer"}`` dicts; ``load_dev(n)`` the first ``n`` dev problems;
    ``dev_correct(text, problem)`` scores a dev completion; ``max_new_tokens`` bounds dev decoding;
    ``hard_focus`` is the default of ``--hard-focus`` (0 where the task has no curriculum)."""

    name: str
    build_tokenizer: Callable[[Path | None], Any]
    tokenizer_dir: Callable[[], Path]
    iter_train: Callable[[int, int, float], Iterator[dict]]
    load_dev: Callable[[int], list[dict]]
    dev_correct: Callable[[str, dict], bool]
    max_new_tokens: int
    hard_focus: float


def _built_in(
    name: str,
    tokenizer: ModuleType,
    splits: ModuleType,
    stream: ModuleType,
    *,
    dev_correct: Callable[[str, dict], bool],
    max_new_tokens: int,
    hard_focus: float,
) -> TrainTask:
    """A built-in task from its package's modules: ``tokenizer`` (``build_tokenizer``, ``tokenizer_dir``),
    ``splits`` (``load_split``) and ``stream`` (``iter_train_problems``)."""
    return TrainTask(
        name=name,
        build_tokenizer=tokenizer.build_tokenizer,
        tokenizer_dir=tokenizer.tokenizer_dir,
        iter_train=lambda seed, start, focus: stream.iter_train_problems(seed, start=start, hard_focus=focus),
        load_dev=lambda n: splits.load_split("dev", n),
        dev_correct=dev_correct,
        max_new_tokens=max_new_tokens,
        hard_focus=hard_focus,
    )


def _gsm() -> TrainTask:
    from s2d2.tasks.tiny_gsm import curriculum, splits, tokenizer
    from s2d2.tasks.tiny_gsm.scoring import is_correct
    from s2d2.training.options import HARD_FOCUS

    def correct(text: str, problem: dict) -> bool:
        return is_correct(text, problem["final"])

    return _built_in("tiny-gsm", tokenizer, splits, curriculum, dev_correct=correct, max_new_tokens=56,
                     hard_focus=HARD_FOCUS)  # fmt: skip


def _code() -> TrainTask:
    from s2d2.tasks.tiny_code import scoring, splits, tokenizer

    return _built_in("tiny-code", tokenizer, splits, splits, dev_correct=scoring.is_exact, max_new_tokens=48,
                     hard_focus=0.0)  # fmt: skip


TRAIN_TASKS: dict[str, Callable[[], TrainTask]] = {"tiny-gsm": _gsm, "tiny-code": _code}


def train_task(name: str) -> TrainTask:
    """The built-in task ``name`` (tiny-gsm | tiny-code); ``ValueError`` for another name."""
    if name not in TRAIN_TASKS:
        raise ValueError(f"unknown training task {name!r}; expected one of {', '.join(TRAIN_TASKS)}")
    return TRAIN_TASKS[name]()

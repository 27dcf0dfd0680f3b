"""Benchmark suites: their splits and generation lengths, their problems, and how an answer is scored."""

from __future__ import annotations

import functools
from typing import Any

from ..errors import S2D2Error

#: Benchmark suites: splits and the generation length their answers need.
SUITES: dict[str, dict[str, Any]] = {
    "tiny-gsm": {"splits": ("test", "dev"), "max_new_tokens": 64},
    "tiny-code": {"splits": ("test", "dev"), "max_new_tokens": 48},
}


def load_problems(suite: str, split: str, n: int | None = None) -> list[dict]:
    """The first ``n`` problems of ``suite``/``split`` (all of them when ``n`` is None); each has ``id``
    and ``question`` (tiny-gsm: ``final``; tiny-code: ``answer`` and ``tests``)."""
    if suite not in SUITES:
        raise S2D2Error(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    splits = SUITES[suite]["splits"]
    if split not in splits:
        raise S2D2Error(f"unknown split {split!r} of suite {suite}; choose one of: {', '.join(splits)}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise S2D2Error(f"n must be an integer >= 1, got {n!r}")
    if suite == "tiny-code":
        from ..tasks.tiny_code.splits import load_split
    else:
        from ..tasks.tiny_gsm.splits import load_split

    try:
        problems = load_split(split, n)
    except (FileNotFoundError, ValueError) as exc:
        raise S2D2Error(f"cannot load {suite} {split}: {exc}") from None
    if n is not None and len(problems) < n:
        raise S2D2Error(f"n={n} exceeds the {len(problems)} problems of {suite} {split}")
    return problems


def score_answer(suite: str, text: str, problem: dict) -> tuple[bool, bool | None]:
    """``(correct, compiles)``: tiny-gsm's final number; tiny-code's program run in the sandbox
    (:mod:`s2d2.evaluation.sandbox`) and whether it compiles (None for tiny-gsm). A program already
    run (the same problem and completion, e.g. from another configuration) is not run again."""
    if suite == "tiny-code":
        return _code_score(problem["id"], problem["question"], tuple(problem["tests"]), text)
    from ..tasks.tiny_gsm.scoring import is_correct

    return is_correct(text, problem["final"]), None


@functools.lru_cache(maxsize=65536)
def _code_score(pid: str, question: str, tests: tuple[str, ...], text: str) -> tuple[bool, bool | None]:
    from ..evaluation.tasks import get_task

    problem = {"id": pid, "question": question, "tests": list(tests)}
    score = get_task("tiny-code").score(problem, text, False)
    return score.correct, score.compiles

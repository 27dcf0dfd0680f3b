"""The ``tiny-gsm`` training curriculum: the endless training stream, optionally thinned towards hard steps.

The tiny model's AR errors concentrate on additions that carry and subtractions that borrow;
:func:`hard_columns` counts those digit columns in a worked answer, :func:`keep_probability` turns the
count into the chance that :func:`iter_train_problems` keeps the problem (``hard_focus``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from .problems import generate_problem
from .splits import heldout_questions, question_hash

__all__ = [
    "borrows",
    "carries",
    "check_hard_focus",
    "hard_columns",
    "iter_train_problems",
    "keep_probability",
]

_EQUATION = re.compile(r"(\d+) ([-+]) (\d+) = \d+")


def carries(a: int, b: int) -> int:
    """How many digit columns of ``a + b`` carry into the next one."""
    n = carry = 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        n += carry
        a, b = a // 10, b // 10
    return n


def borrows(a: int, b: int) -> int:
    """How many digit columns of ``a - b`` (``a >= b >= 0``) borrow from the next one."""
    if b > a or b < 0:
        raise ValueError(f"borrows needs a >= b >= 0, got {a} - {b}")
    n = borrow = 0
    while a:
        borrow = int(a % 10 - b % 10 - borrow < 0)
        n += borrow
        a, b = a // 10, b // 10
    return n


def hard_columns(answer: str) -> int:
    """Carrying and borrowing digit columns over the additions and subtractions of a worked answer.

    The tiny model's AR errors concentrate on these steps (27 of 33 test errors before --hard-focus).
    """
    n = 0
    for a, op, b in _EQUATION.findall(answer):
        n += carries(int(a), int(b)) if op == "+" else borrows(int(a), int(b))
    return n


def check_hard_focus(focus: float) -> float:
    if not 0.0 <= focus < 1.0:
        raise ValueError(f"hard focus must be in [0, 1), got {focus}")
    return float(focus)


def keep_probability(hard: int, focus: float) -> float:
    """Probability that the training stream keeps a problem with ``hard`` carrying/borrowing columns.

    ``focus`` 0 keeps every problem (the natural distribution); otherwise problems with no such column
    are kept with probability ``1 - focus``, with one ``1 - focus / 2``, and with two or more always.
    """
    return 1.0 - check_hard_focus(focus) * max(0.0, 1.0 - hard / 2)


def iter_train_problems(seed: int, start: int = 0, hard_focus: float = 0.0) -> Iterator[dict]:
    """An endless stream of training problems for ``seed``, skipping held-out questions.

    Problem ``i`` of the stream depends only on ``(seed, hard_focus, i // 4096)`` so a resumed run can
    restart at ``start`` cheaply. ``hard_focus`` > 0 thins out problems with few carrying or borrowing
    columns (:func:`keep_probability`); 0 gives the natural distribution, as the test split has it.
    """
    check_hard_focus(hard_focus)
    held = heldout_questions()
    chunk = start // 4096
    skip = start % 4096
    while True:
        rng = random.Random(f"tiny-gsm-train-{seed}-{chunk}")
        thin = random.Random(f"tiny-gsm-thin-{seed}-{chunk}")
        i = -1
        while i < 4095:
            prob = generate_problem(rng)
            if hard_focus > 0 and thin.random() >= keep_probability(hard_columns(prob["answer"]), hard_focus):
                continue
            i += 1
            if i < skip:
                continue
            if question_hash(prob["question"]) in held:
                continue
            yield prob
        skip = 0
        chunk += 1

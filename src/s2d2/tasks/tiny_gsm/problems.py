"""One ``tiny-gsm`` problem drawn from a random generator: :func:`generate_problem`.

Every problem is a short story about one person and one kind of object, with 2-4 arithmetic steps
(``+ - * /``). All numbers (operands, intermediate results and the answer) lie in ``[0, MAX_VALUE]``
and a division is only used when it divides exactly. For ``+`` and ``*`` the operand order is random,
so one question has several valid answer texts (the answers are multimodal on purpose).

The answer text has one equation per step, then the final answer::

    3 * 8 = 24. 47 - 24 = 23. #### 23

(written with normal spacing, so that the tiny-gsm tokenizer's ``decode(encode(answer)) == answer``;
token-wise this is ``3 * 8 = 2 @@4 . 4 @@7 - 2 @@4 = 2 @@3 . #### 2 @@3``).

Each step kind has its own helper (``_add_step`` ... ``_give_each_step``); the draws from the generator
happen in a fixed order, so a seed always gives the same problems.
"""

from __future__ import annotations

import random
import re

from .templates import (
    ADD_TEMPLATES,
    BOX_TEMPLATES,
    CONNECTORS,
    CONTAINERS,
    DIV_TEMPLATES,
    GIVE_EACH_TEMPLATES,
    GROUPS,
    MUL_TEMPLATES,
    MUL_WORDS,
    NAMES_F,
    NAMES_M,
    OBJECTS,
    PEOPLE,
    QUESTION_TEMPLATES,
    START_TEMPLATES,
    SUB_TEMPLATES,
    capitalize_first,
)

__all__ = ["MAX_QUESTION_TOKENS", "MAX_VALUE", "generate_problem"]

MAX_VALUE = 999
MAX_QUESTION_TOKENS = 56

#: What a step helper returns: the step's sentence, its equations and the new count; None when the
#: step does not fit the current count (the caller then draws another kind).
_Step = tuple[str, list[str], int] | None


def _eq(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}."


def _commutative(rng: random.Random, a: int, op: str, b: int, c: int) -> str:
    if rng.random() < 0.5:
        a, b = b, a
    return _eq(a, op, b, c)


def _add_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    hi = min(99 if rng.random() < 0.8 else 300, MAX_VALUE - cur)
    if hi < 2:
        return None
    x = rng.randint(2, hi)
    text = rng.choice(ADD_TEMPLATES).format(x=x, **fmt)
    return text, [_commutative(rng, cur, "+", x, cur + x)], cur + x


def _sub_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    if cur < 3:
        return None
    x = rng.randint(2, cur - 1)
    text = rng.choice(SUB_TEMPLATES).format(x=x, name2=rng.choice(others), **fmt)
    return text, [_eq(cur, "-", x, cur - x)], cur - x


def _mul_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    ks = [k for k in range(2, 6) if cur * k <= MAX_VALUE]
    if not ks or cur < 2:
        return None
    k = rng.choice(ks)
    if k in MUL_WORDS and rng.random() < 0.4:
        text = MUL_WORDS[k].format(**fmt)
    else:
        text = rng.choice(MUL_TEMPLATES).format(k=k, **fmt)
    return text, [_commutative(rng, cur, "*", k, cur * k)], cur * k


def _div_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    ks = [k for k in range(2, 10) if cur % k == 0 and cur // k >= 1]
    if not ks:
        return None
    k = rng.choice(ks)
    templates = DIV_TEMPLATES if k >= 3 else DIV_TEMPLATES[:2]  # no "with 1 friends"
    text = rng.choice(templates).format(
        k=k, km1=k - 1, group=rng.choice(GROUPS), people=rng.choice(PEOPLE), **fmt
    )
    return text, [_eq(cur, "/", k, cur // k)], cur // k


def _box_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    k, m = rng.randint(2, 9), rng.randint(2, 25)
    total = k * m
    if cur + total > MAX_VALUE:
        return None
    text = rng.choice(BOX_TEMPLATES).format(k=k, m=m, cont=rng.choice(CONTAINERS), **fmt)
    product = _commutative(rng, k, "*", m, total)
    return text, [product, _commutative(rng, cur, "+", total, cur + total)], cur + total


def _give_each_step(rng: random.Random, cur: int, fmt: dict, others: list[str]) -> _Step:
    pairs = [(k, m) for k in range(2, 10) for m in range(2, 26) if k * m < cur]
    if not pairs:
        return None
    k, m = rng.choice(pairs)
    total = k * m
    text = rng.choice(GIVE_EACH_TEMPLATES).format(
        k=k, m=m, cont=rng.choice(CONTAINERS), people=rng.choice(PEOPLE), **fmt
    )
    return text, [_commutative(rng, k, "*", m, total), _eq(cur, "-", total, cur - total)], cur - total


_STEPS = {
    "add": _add_step,
    "sub": _sub_step,
    "mul": _mul_step,
    "div": _div_step,
    "box": _box_step,
    "give_each": _give_each_step,
}


def _try_problem(rng: random.Random) -> dict | None:
    female = rng.random() < 0.5
    name = rng.choice(NAMES_F if female else NAMES_M)
    others = [n for n in NAMES_F + NAMES_M if n != name]
    p, po = ("she", "her") if female else ("he", "him")
    obj = rng.choice(OBJECTS)
    n_eq = rng.choice([2, 3, 4])

    start = rng.randint(2, 120) if rng.random() < 0.8 else rng.randint(2, 400)
    cur = start
    sentences = [rng.choice(START_TEMPLATES).format(name=name, n=start, obj=obj)]
    eqs: list[str] = []
    fmt = {"p": p, "po": po, "obj": obj}
    while len(eqs) < n_eq:
        left = n_eq - len(eqs)
        kinds = ["add", "sub", "mul", "div"] + (["box", "give_each"] if left >= 2 else [])
        step = _STEPS[rng.choice(kinds)](rng, cur, fmt, others)
        if step is None:
            continue
        text, step_eqs, cur = step
        eqs.extend(step_eqs)
        conn = rng.choice(CONNECTORS) if len(sentences) > 1 else rng.choice(["", "", "Then"])
        sentences.append(capitalize_first(f"{conn} {text}".strip()) if conn else capitalize_first(text))
    if not 0 <= cur <= MAX_VALUE:
        return None
    sentences.append(rng.choice(QUESTION_TEMPLATES).format(obj=obj, name=name, pl=p))
    question = " ".join(sentences)
    if _approx_tokens(question) > MAX_QUESTION_TOKENS:
        return None
    answer = " ".join(eqs) + f" #### {cur}"
    return {"question": question, "answer": answer, "final": str(cur)}


def _approx_tokens(text: str) -> int:
    """Token count under the tiny-gsm tokenizer (one token per word, digit and punctuation mark)."""
    return len(re.findall(r"[A-Za-z]+|\d|[^\w\s]+", text))


def generate_problem(rng: random.Random) -> dict:
    """Draw one problem from ``rng`` (a :class:`random.Random`): ``dict(question, answer, final)``."""
    while True:
        prob = _try_problem(rng)
        if prob is not None:
            return prob

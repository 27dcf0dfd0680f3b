"""The task kinds of ``tiny-code``: each draws one small Python function from a :class:`random.Random`.

A kind returns a :class:`Draft`: the argument names and types, the docstring that states the task, and
the canonical body (4-space indents, no leading indent: :mod:`.problems` indents it). The docstring fixes
the body: one task, one canonical text, so the model learns a mapping and the dev split can be scored by
exact match (the test split is scored by executing its asserts).

Kinds cover arithmetic, conditionals, ``for``/``while`` loops, list transforms and string transforms.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["CMPS", "Draft", "INT_ARGS", "KINDS", "LIST_ARGS", "OPS", "STR_ARGS", "WORDS"]

INT_ARGS = ["a", "b", "n", "x", "y", "k", "m", "num", "value"]
LIST_ARGS = ["xs", "nums", "items", "values", "data", "arr", "numbers"]
STR_ARGS = ["s", "text", "word", "name", "line"]
#: operator -> its words in a docstring
OPS = {"+": "plus", "-": "minus", "*": "times", "//": "floor divided by", "%": "modulo"}
CMPS = {">": "greater than", "<": "less than", ">=": "at least", "<=": "at most", "==": "equal to"}
#: short string literals a body may hold (letters only)
WORDS = ["ab", "xy", "ok", "no", "yes", "big", "small", "even", "odd", "low", "high", "zero"]
LETTERS = list("aeiostnrx")


@dataclass
class Draft:
    """One function before assembly: ``args`` as ``(name, kind)`` with kind int | list | str."""

    args: list[tuple[str, str]]
    doc: str
    body: str


def _const(rng: random.Random, op: str = "+") -> int:
    return rng.randint(2, 9) if op in ("//", "%") else rng.randint(1, 20)


def _arith_const(rng: random.Random) -> Draft:
    a, op = rng.choice(INT_ARGS), rng.choice(list(OPS))
    k = _const(rng, op)
    return Draft([(a, "int")], f"Return {a} {OPS[op]} {k}.", f"return {a} {op} {k}")


def _arith_two(rng: random.Random) -> Draft:
    a, b = rng.sample(INT_ARGS, 2)
    op1, op2 = rng.choice(["+", "-", "*"]), rng.choice(list(OPS))
    k = _const(rng, op2)
    return Draft(
        [(a, "int"), (b, "int")],
        f"Return {a} {OPS[op1]} {b} {OPS[op2]} {k}.",
        f"return {a} {op1} {b} {op2} {k}",
    )


def _arith_group(rng: random.Random) -> Draft:
    a, b = rng.sample(INT_ARGS, 2)
    op1 = rng.choice(["+", "-", "*"])
    name = {"+": "sum", "-": "difference", "*": "product"}[op1]
    op2 = rng.choice(list(OPS))
    k = _const(rng, op2)
    doc = f"Return the {name} of {a} and {b}, {OPS[op2]} {k}."
    return Draft([(a, "int"), (b, "int")], doc, f"return ({a} {op1} {b}) {op2} {k}")


def _if_else(rng: random.Random) -> Draft:
    a, cmp = rng.choice(INT_ARGS), rng.choice(list(CMPS))
    k, op1, op2 = rng.randint(0, 20), rng.choice(["+", "-", "*"]), rng.choice(["+", "-", "*"])
    k1, k2 = rng.randint(1, 9), rng.randint(1, 9)
    doc = f"If {a} is {CMPS[cmp]} {k}, return {a} {OPS[op1]} {k1}; otherwise return {a} {OPS[op2]} {k2}."
    body = f"if {a} {cmp} {k}:\n    return {a} {op1} {k1}\nreturn {a} {op2} {k2}"
    return Draft([(a, "int")], doc, body)


def _larger(rng: random.Random) -> Draft:
    a, b = rng.sample(INT_ARGS, 2)
    big = rng.random() < 0.5
    doc = f"Return the {'larger' if big else 'smaller'} of {a} and {b}."
    body = f"if {a} {'>' if big else '<'} {b}:\n    return {a}\nreturn {b}"
    return Draft([(a, "int"), (b, "int")], doc, body)


def _parity(rng: random.Random) -> Draft:
    a = rng.choice(INT_ARGS)
    w1, w2 = rng.sample(WORDS, 2)
    d = rng.randint(2, 5)
    doc = f"Return '{w1}' if {a} is divisible by {d}, else '{w2}'."
    body = f"if {a} % {d} == 0:\n    return '{w1}'\nreturn '{w2}'"
    return Draft([(a, "int")], doc, body)


def _three_way(rng: random.Random) -> Draft:
    a, k = rng.choice(INT_ARGS), rng.randint(0, 20)
    w1, w2, w3 = rng.sample(WORDS, 3)
    doc = f"Return '{w1}' if {a} is greater than {k}, '{w2}' if it is equal to {k}, else '{w3}'."
    body = f"if {a} > {k}:\n    return '{w1}'\nelif {a} == {k}:\n    return '{w2}'\nreturn '{w3}'"
    return Draft([(a, "int")], doc, body)


def _range_sum(rng: random.Random) -> Draft:
    n, op = rng.choice(["n", "k", "m", "count", "limit"]), rng.choice(["+", "*", "%"])
    k = _const(rng, op)
    doc = f"Return the sum of i {OPS[op]} {k} for every i from 0 up to {n} minus 1."
    body = f"total = 0\nfor i in range({n}):\n    total += i {op} {k}\nreturn total"
    return Draft([(n, "int")], doc, body)


def _product_loop(rng: random.Random) -> Draft:
    n, start = rng.choice(["n", "k", "m", "count", "limit"]), rng.randint(1, 3)
    doc = f"Return the product of the numbers from {start} to {n}."
    body = f"result = 1\nfor i in range({start}, {n} + 1):\n    result *= i\nreturn result"
    return Draft([(n, "small")], doc, body)


def _while_div(rng: random.Random) -> Draft:
    n, d = rng.choice(["n", "x", "num", "value"]), rng.randint(2, 10)
    doc = f"Return how many times {n} can be floor divided by {d} before it reaches 0."
    body = f"count = 0\nwhile {n} > 0:\n    {n} //= {d}\n    count += 1\nreturn count"
    return Draft([(n, "int")], doc, body)


def _list_total(rng: random.Random) -> Draft:
    xs, cmp = rng.choice(LIST_ARGS), rng.choice(list(CMPS))
    k = rng.randint(0, 20)
    if rng.random() < 0.5:
        doc = f"Return the sum of the items in {xs} that are {CMPS[cmp]} {k}."
        body = f"total = 0\nfor x in {xs}:\n    if x {cmp} {k}:\n        total += x\nreturn total"
    else:
        doc = f"Return how many items in {xs} are {CMPS[cmp]} {k}."
        body = f"count = 0\nfor x in {xs}:\n    if x {cmp} {k}:\n        count += 1\nreturn count"
    return Draft([(xs, "list")], doc, body)


def _list_map(rng: random.Random) -> Draft:
    xs, op = rng.choice(LIST_ARGS), rng.choice(list(OPS))
    k = _const(rng, op)
    doc = f"Return a list of each item in {xs} {OPS[op]} {k}."
    return Draft([(xs, "list")], doc, f"return [x {op} {k} for x in {xs}]")


def _list_filter(rng: random.Random) -> Draft:
    xs, cmp = rng.choice(LIST_ARGS), rng.choice(list(CMPS))
    k = rng.randint(0, 20)
    doc = f"Return a list of the items in {xs} that are {CMPS[cmp]} {k}."
    return Draft([(xs, "list")], doc, f"return [x for x in {xs} if x {cmp} {k}]")


def _list_append(rng: random.Random) -> Draft:
    xs, cmp, op = rng.choice(LIST_ARGS), rng.choice(list(CMPS)), rng.choice(["+", "-", "*"])
    k, k2 = rng.randint(0, 20), rng.randint(1, 9)
    doc = f"Return a list of x {OPS[op]} {k2} for each item x in {xs} that is {CMPS[cmp]} {k}."
    body = f"out = []\nfor x in {xs}:\n    if x {cmp} {k}:\n        out.append(x {op} {k2})\nreturn out"
    return Draft([(xs, "list")], doc, body)


def _list_builtin(rng: random.Random) -> Draft:
    xs, k = rng.choice(LIST_ARGS), rng.randint(1, 3)
    doc, expr = rng.choice(
        [
            ("Return the largest item in {xs}.", "max({xs})"),
            ("Return the smallest item in {xs}.", "min({xs})"),
            ("Return the number of items in {xs}.", "len({xs})"),
            ("Return the sum of the items in {xs}.", "sum({xs})"),
            ("Return {xs} sorted in increasing order.", "sorted({xs})"),
            ("Return {xs} sorted in decreasing order.", "sorted({xs}, reverse=True)"),
            ("Return {xs} reversed.", "{xs}[::-1]"),
            ("Return the first {k} items of {xs}.", "{xs}[:{k}]"),
            ("Return the items of {xs} after the first {k}.", "{xs}[{k}:]"),
            ("Return the last item of {xs}.", "{xs}[-1]"),
            ("Return the largest item in {xs} minus the smallest.", "max({xs}) - min({xs})"),
        ]
    )
    return Draft([(xs, "list")], doc.format(xs=xs, k=k), "return " + expr.format(xs=xs, k=k))


def _list_best(rng: random.Random) -> Draft:
    xs = rng.choice(LIST_ARGS)
    big = rng.random() < 0.5
    doc = f"Return the {'largest' if big else 'smallest'} item in {xs}, found with a loop."
    cmp = ">" if big else "<"
    body = f"best = {xs}[0]\nfor x in {xs}:\n    if x {cmp} best:\n        best = x\nreturn best"
    return Draft([(xs, "list")], doc, body)


def _str_method(rng: random.Random) -> Draft:
    s, w, k = rng.choice(STR_ARGS), rng.choice(WORDS), rng.randint(2, 4)
    c1, c2 = rng.sample(LETTERS, 2)
    doc, expr = rng.choice(
        [
            ("Return {s} in upper case.", "{s}.upper()"),
            ("Return {s} reversed.", "{s}[::-1]"),
            ("Return the length of {s}.", "len({s})"),
            ("Return {s} followed by '{w}'.", "{s} + '{w}'"),
            ("Return '{w}' followed by {s}.", "'{w}' + {s}"),
            ("Return {s} repeated {k} times.", "{s} * {k}"),
            ("Return the first character of {s}.", "{s}[0]"),
            ("Return the last character of {s}.", "{s}[-1]"),
            ("Return the first {k} characters of {s}.", "{s}[:{k}]"),
            ("Return how many times '{c1}' occurs in {s}.", "{s}.count('{c1}')"),
            ("Return {s} with every '{c1}' replaced by '{c2}'.", "{s}.replace('{c1}', '{c2}')"),
            ("Return whether {s} starts with '{c1}'.", "{s}.startswith('{c1}')"),
            ("Return whether {s} ends with '{c1}'.", "{s}.endswith('{c1}')"),
            ("Return whether {s} reads the same reversed.", "{s} == {s}[::-1]"),
        ]
    )
    fmt = dict(s=s, w=w, k=k, c1=c1, c2=c2)
    return Draft([(s, "str")], doc.format(**fmt), "return " + expr.format(**fmt))


def _str_loop(rng: random.Random) -> Draft:
    s = rng.choice(STR_ARGS)
    c = rng.choice(LETTERS)
    if rng.random() < 0.5:
        doc = f"Return how many vowels {s} has."
        body = f"count = 0\nfor ch in {s}:\n    if ch in 'aeiou':\n        count += 1\nreturn count"
    else:
        doc = f"Return {s} without the letter '{c}'."
        body = f"out = ''\nfor ch in {s}:\n    if ch != '{c}':\n        out += ch\nreturn out"
    return Draft([(s, "str")], doc, body)


#: kind name -> (drawing function, weight)
KINDS = {
    "arith_const": (_arith_const, 1.0),
    "arith_two": (_arith_two, 1.0),
    "arith_group": (_arith_group, 1.0),
    "if_else": (_if_else, 1.2),
    "larger": (_larger, 0.6),
    "parity": (_parity, 0.8),
    "three_way": (_three_way, 0.8),
    "range_sum": (_range_sum, 0.8),
    "product_loop": (_product_loop, 0.5),
    "while_div": (_while_div, 0.6),
    "list_total": (_list_total, 1.2),
    "list_map": (_list_map, 1.0),
    "list_filter": (_list_filter, 1.0),
    "list_append": (_list_append, 1.0),
    "list_builtin": (_list_builtin, 1.2),
    "list_best": (_list_best, 0.6),
    "str_method": (_str_method, 1.4),
    "str_loop": (_str_loop, 0.8),
}

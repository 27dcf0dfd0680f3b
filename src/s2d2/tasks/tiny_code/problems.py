"""One ``tiny-code`` problem drawn from a random generator: :func:`generate_problem`.

A problem is a small Python function. The prompt (``question``) is its header and docstring, the answer
its body; the program a completion is judged by is ``question + completion`` followed by the problem's
2-4 asserts (``tests``)::

    question: def compute(xs):\\n    \"\"\"Return a list of each item in xs times 3.\"\"\"
    answer:   \\n    return [x * 3 for x in xs]
    tests:    assert compute([4, 0, 7]) == [12, 0, 21]

The asserts' expected values come from running the canonical body on drawn inputs: this is the
project's own template code, run here at generation time, never a model's output (that runs in the
sandbox only, :mod:`s2d2.evaluation.sandbox`).
"""

from __future__ import annotations

import random
import textwrap

from .kinds import KINDS, Draft

__all__ = ["FUNCTION_NAMES", "INDENT", "TEST_WORDS", "generate_problem", "program_text"]

INDENT = "    "
FUNCTION_NAMES = [
    "f",
    "g",
    "solve",
    "compute",
    "calc",
    "helper",
    "process",
    "transform",
    "answer",
    "result_of",
]
#: strings a test passes to a string argument
TEST_WORDS = [
    "apple",
    "banana",
    "hello",
    "data",
    "python",
    "level",
    "river",
    "stone",
    "tiger",
    "noon",
    "radar",
]


def _draw_value(rng: random.Random, kind: str):
    if kind == "int":
        return rng.randint(0, 30)
    if kind == "small":
        return rng.randint(0, 7)
    if kind == "list":
        return [rng.randint(0, 30) for _ in range(rng.randint(3, 6))]
    return rng.choice(TEST_WORDS)


def _reference(name: str, draft: Draft):
    """The canonical function, defined from its own template text (trusted: the generator's code)."""
    source = _header(name, draft) + "\n" + textwrap.indent(draft.body, INDENT) + "\n"
    scope: dict = {}
    exec(compile(source, "<tiny-code reference>", "exec"), scope)  # noqa: S102 - the project's own template
    return scope[name]


def _header(name: str, draft: Draft) -> str:
    args = ", ".join(a for a, _ in draft.args)
    return f'def {name}({args}):\n{INDENT}"""{draft.doc}"""'


def _tests(rng: random.Random, name: str, draft: Draft) -> list[str]:
    fn = _reference(name, draft)
    tests: list[str] = []
    for _ in range(rng.randint(2, 4)):
        values = [_draw_value(rng, kind) for _, kind in draft.args]
        expected = fn(*[list(v) if isinstance(v, list) else v for v in values])
        tests.append(f"assert {name}({', '.join(repr(v) for v in values)}) == {expected!r}")
    return tests


def program_text(question: str, completion: str, tests: list[str]) -> str:
    """The program run for a completion: the header, the completion, a blank line and the asserts."""
    return question + completion + "\n\n\n" + "\n".join(tests) + "\n"


def generate_problem(rng: random.Random) -> dict:
    """Draw one problem from ``rng``: ``dict(question, answer, entry_point, kind, tests)``.

    ``question + answer`` is a complete function; ``answer`` starts with a newline and its lines are
    indented by :data:`INDENT`."""
    names = list(KINDS)
    kind = rng.choices(names, weights=[KINDS[k][1] for k in names])[0]
    draft = KINDS[kind][0](rng)
    name = rng.choice(FUNCTION_NAMES)
    question = _header(name, draft)
    answer = "\n" + textwrap.indent(draft.body, INDENT)
    return {
        "question": question,
        "answer": answer,
        "entry_point": name,
        "kind": kind,
        "tests": _tests(rng, name, draft),
    }

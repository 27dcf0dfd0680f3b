"""The Python static checks: dead texts (no continuation makes them valid), incomplete ones (not dead),
the final check, key positions, the program inside a prompt and completion, and the plugin registry."""

from __future__ import annotations

import pytest

from s2d2.codecheck import CHECKERS, get_checker
from s2d2.codecheck.base import Verdict, register
from s2d2.codecheck.keys import python_key_positions
from s2d2.codecheck.source import program_of

HEAD = 'def f(x, xs):\n    """Return something."""'

DEAD = {
    "mismatched bracket": "\n    return (x]",
    "closing nothing": "\n    return x)",
    "string open at its line's end": "\n    return 'ab\n    return x",
    "inconsistent dedent": "\n    if x > 2:\n        return 1\n  return 2",
    "a completed line that cannot compile": "\n    return x + 1 1\n    ",
    "an operator ending a completed line": "\n    return x +\n    ",
    "else without if": "\n    else:\n        return 1\n",
    "comprehension missing its condition": "\n    return [y for y in xs if]\n",
    "no Python token": "\n    return x ? 1\n",
    "the line being written, past its error": "\n    for y in xs::if",
    "a stray token mid-line": "\n    y = [1, 2 3",
}
ALIVE = {
    "the prompt alone": "",
    "a line being written": "\n    return x +",
    "an open bracket": "\n    return [y * 2 for y in",
    "a block header waiting for its body": "\n    if x > 2:\n",
    "a header and its first line": "\n    for y in xs:\n        x += y",
    "a string being written": "\n    return 'ab",
    "a try waiting for except": "\n    try:\n        y = 1\n",
    "a conditional expression waiting for else": "\n    return x if x > 0",
    "a doubled colon, the line's last token": "\n    if x == 1::",
    "a whole body": "\n    total = 0\n    for y in xs:\n        total += y\n    return total",
}


@pytest.mark.parametrize("name", sorted(DEAD))
def test_dead_texts(name):
    verdict = get_checker("python").check(HEAD + DEAD[name])
    assert verdict.dead and verdict.reason


@pytest.mark.parametrize("name", sorted(ALIVE))
def test_incomplete_texts_are_not_dead(name):
    assert get_checker("python").check(HEAD + ALIVE[name]) == Verdict(False)


def test_final_texts_must_compile_as_they_are():
    c = get_checker("python")
    assert c.check(HEAD + "\n    return x", final=True) == Verdict(False)
    assert c.check(HEAD + "\n    return x +", final=True).dead
    assert c.check(HEAD + "\n    return [x", final=True).dead
    assert c.check(HEAD + "\n    if x:", final=True).dead


def test_compile_runs_only_when_the_completed_lines_change():
    c = get_checker("python")
    c.check(HEAD + "\n    y = x\n    ")
    first = c.compiles
    c.check(HEAD + "\n    y = x\n    ")  # the same completed lines: the kept verdict answers
    assert c.compiles == first
    c.check(HEAD + "\n    y = x\n    z = y\n    ")
    assert c.compiles == first + 1


def test_checks_run_nothing(tmp_path):
    marker = tmp_path / "ran"
    text = f"open({str(marker)!r}, 'w').write('x')\n"
    assert not get_checker("python").check(text).dead
    assert not get_checker("python").check(text, final=True).dead
    assert not marker.exists()


def test_key_positions():
    pieces = ["\n    ", "return", " x", " +", " 1", "\n    ", "if", " y", " >", " 2", ":", " (", "z", ")"]
    keys = [pieces[i] for i in python_key_positions(HEAD, pieces)]
    assert keys == ["\n    ", "return", " x", " +", "\n    ", "if", " >", ")"]
    assert python_key_positions("total =", [" total", " +", " x"]) == [0, 1]  # a name after "=", an operator
    assert python_key_positions("def", [" g", "(", "x", ")"]) == [0, 3]


def test_program_of_raw_and_fenced_completions():
    assert program_of(HEAD, "\n    return x", True).text == HEAD + "\n    return x"
    assert program_of("Write f.", "Sure:\n", False) is None  # prose before any code
    assert program_of("Write f.", "Sure:\n```pyth", False) is None  # the fence's tag is being written
    p = program_of("Write f.", "Sure:\n```python\ndef f(x):\n    return x\n", False)
    assert p.text == "def f(x):\n    return x\n" and not p.closed
    p = program_of("Write f.", "```python\ndef f(x):\n    return x\n```\nDone.", False)
    assert p.text == "def f(x):\n    return x\n" and p.closed


def test_a_language_plugs_in_by_name():
    class Never:
        name = "never-dead"

        def check(self, text, final=False):
            return Verdict(False)

        def key_positions(self, before, pieces):
            return []

    register("never-dead", Never)
    try:
        assert not get_checker("never-dead").check(")))").dead
    finally:
        CHECKERS.pop("never-dead")
    with pytest.raises(ValueError, match="python"):
        get_checker("cobol")


def test_incremental_checks_agree_with_fresh_ones():
    """One checker fed growing texts (it tokenizes only past the last valid completed lines) says what a
    new checker says of each text, dead or not, through nested blocks, dedents and broken tails."""
    from s2d2.tasks.tiny_code.splits import load_split

    programs = [p["question"] + p["answer"] for p in load_split("test", 40)]
    programs += [HEAD + t for t in DEAD.values()] + [HEAD + t for t in ALIVE.values()]
    programs.append(HEAD + "\n    if x:\n        for y in xs:\n            x += y\n    else:\n  return x")
    for program in programs:
        inc = get_checker("python")
        for end in range(len(HEAD) - 5, len(program) + 1):
            text = program[:end]
            assert inc.check(text) == get_checker("python").check(text), repr(text)
        assert inc.check(program, final=True) == get_checker("python").check(program, final=True)

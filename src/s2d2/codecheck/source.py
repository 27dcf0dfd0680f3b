"""Where the program is in a prompt and its completion so far: :func:`program_of`.

* A completion that has opened a fenced code block (a chat answer, ```` ```python ````): the program is
  the block's text (to its closing fence, which ends the program).
* Else, a prompt that is itself the start of a program (a function stub, HumanEval's and tiny-code's
  prompts): the program is prompt + completion.
* Else (prose before any fence): no program yet.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FENCE", "Program", "program_of"]

FENCE = "```"


@dataclass(frozen=True)
class Program:
    """A program's text so far; ``start`` is where the completion's own text begins in it (0 for a
    fenced block); ``closed``: a closing fence ended it (it must be valid as it is)."""

    text: str
    start: int
    closed: bool = False


def program_of(prompt: str, completion: str, prompt_is_code: bool) -> Program | None:
    """The program in ``prompt`` + ``completion`` (see the module docstring); ``prompt_is_code``: whether
    the prompt is itself the start of a program (the caller checks it once)."""
    at = completion.find(FENCE)
    if at >= 0:
        line_end = completion.find("\n", at)
        if line_end < 0:
            return None  # the fence's language tag is still being written
        body = completion[line_end + 1 :]
        close = body.find(FENCE)
        if close >= 0:
            return Program(body[:close], 0, closed=True)
        return Program(body, 0)
    if prompt_is_code:
        return Program(prompt + completion, len(prompt))
    return None

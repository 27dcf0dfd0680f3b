"""What the ``syntax`` routing policy sees of a drafted span: the program text with and without it.

:class:`SpanSource` is the step's token ids (prompt, the completion before the span, the span up to a
stop token); :class:`SyntaxView` (one per request) decodes them with the model's tokenizer, finds the
program in them (:func:`s2d2.codecheck.source.program_of`) and asks the language's checker
(:mod:`s2d2.codecheck`) whether the span leaves the program dead, and which span tokens sit at key
positions. It times itself: ``seconds`` over ``checks`` is the host time a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..codecheck import get_checker
from ..codecheck.source import program_of

__all__ = ["Detokenize", "SpanSource", "SyntaxView"]

#: token ids -> text (the model tokenizer's decode, special tokens skipped)
Detokenize = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class SpanSource:
    """A drafted span in its row: ``prompt`` ids, the committed completion ``before`` the span, the
    span's drafted ids (cut after a stop token) and whether the span holds the stop token (``final``)."""

    prompt: list[int]
    before: list[int]
    span: list[int]
    final: bool


class SyntaxView:
    """One request's static checks of its drafted spans (see the module docstring)."""

    def __init__(self, language: str, detokenize: Detokenize):
        self.checker = get_checker(language)
        self.detokenize = detokenize
        self._prompt: tuple[tuple[int, ...], str, bool] | None = None
        #: host time spent in checks, and the checks made (steps whose span was checked)
        self.seconds = 0.0
        self.checks = 0
        #: spans found dead
        self.dead_spans = 0

    def _prompt_text(self, ids: list[int]) -> tuple[str, bool]:
        key = tuple(ids)
        if self._prompt is None or self._prompt[0] != key:
            text = self.detokenize(ids)
            self._prompt = (key, text, not self.checker.check(text).dead)
        return self._prompt[1], self._prompt[2]

    def dead(self, src: SpanSource) -> bool:
        """Whether no continuation can make the program valid once the span is committed (False when
        the text holds no program yet)."""
        t0 = time.perf_counter()
        try:
            prompt, is_code = self._prompt_text(src.prompt)
            full = self.detokenize(src.prompt + src.before + src.span)
            program = program_of(prompt, full[len(prompt) :] if full.startswith(prompt) else full, is_code)
            if program is None:
                return False
            dead = self.checker.check(program.text, final=src.final or program.closed).dead
            self.dead_spans += dead
            return dead
        finally:
            self.checks += 1
            self.seconds += time.perf_counter() - t0

    def key_positions(self, src: SpanSource) -> list[int]:
        """Indices into the span of its tokens at key positions (none before a program starts)."""
        t0 = time.perf_counter()
        try:
            before = self.detokenize(src.prompt + src.before)
            pieces = [self.detokenize([t]) for t in src.span]
            return self.checker.key_positions(before, pieces)
        finally:
            self.seconds += time.perf_counter() - t0

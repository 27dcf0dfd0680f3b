"""The language-plugin interface of the static checks: :class:`LanguageChecker`, :class:`Verdict`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CHECKERS", "LanguageChecker", "Verdict", "get_checker", "register"]


@dataclass(frozen=True)
class Verdict:
    """What a check says of a program's text so far.

    ``dead``: no continuation can make the program valid (a mismatched bracket, an unterminated
    one-line string, an inconsistent dedent, a completed line that cannot compile); ``reason`` says which
    (empty when not dead). A text that is merely incomplete (an open bracket, a block with no body
    yet) is not dead."""

    dead: bool
    reason: str = ""


OK = Verdict(False)


class LanguageChecker(Protocol):
    """A language's checks. Implementations keep any cache they like (a checker serves one request)."""

    #: the name ``syntax_language`` selects it by
    name: str

    def check(self, text: str, final: bool = False) -> Verdict:
        """Whether ``text`` can still begin a valid program (``final``: the program ends here, so it must
        be valid as it is)."""
        ...

    def key_positions(self, before: str, pieces: list[str]) -> list[int]:
        """Indices into ``pieces`` (the span's token texts, in order, after the text ``before``) of
        tokens at key positions: where a wrong token is costly."""
        ...


#: language name -> a factory of its checker
CHECKERS: dict[str, Callable[[], LanguageChecker]] = {}


def register(name: str, factory: Callable[[], LanguageChecker]) -> None:
    """Make ``factory`` the checker of language ``name``."""
    CHECKERS[name] = factory


def get_checker(name: str) -> LanguageChecker:
    """A new checker for language ``name``; ``ValueError`` naming the known languages otherwise."""
    if name not in CHECKERS:
        raise ValueError(f"no static checker for language {name!r}; known: {', '.join(sorted(CHECKERS))}")
    return CHECKERS[name]()

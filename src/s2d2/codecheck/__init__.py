"""Static checks on program text, for routing: can a program that starts with this text still be valid?

Pure functions of text (no model, no engine, nothing of the rest of the package): the routing policy
``syntax`` (:mod:`s2d2.decoding.policies`) asks a language's checker whether a drafted span leaves the
program so far beyond repair, and which of the span's tokens sit at key positions.

A language plugs in by implementing :class:`~.base.LanguageChecker` and registering it in
:data:`~.base.CHECKERS` under its name (``syntax_language``). Python is the one built
(:mod:`.python`); :mod:`.keys` finds Python's key positions; :mod:`.source` finds the program inside
a prompt and completion (a raw continuation, or a fenced code block of a chat answer).
"""

from . import python as _python  # noqa: F401 - registers the built-in language
from .base import CHECKERS, LanguageChecker, Verdict, get_checker

__all__ = ["CHECKERS", "LanguageChecker", "Verdict", "get_checker"]

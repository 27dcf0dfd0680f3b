"""Key positions of Python code: the tokens where a wrong draft costs most.

:func:`python_key_positions` marks, among a span's token texts, a token that starts a line (and a token
holding the newline and indentation before it: it decides the block), a name right after ``def``,
``return`` or an assignment (``=``, ``+=``, ...), an operator (arithmetic, comparison, ``and``/``or``/
``not``/``in``/``is``), and a closing bracket.
"""

from __future__ import annotations

import re

__all__ = ["OPERATORS", "python_key_positions"]

OPERATORS = frozenset(
    ["+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "not", "in", "is"]
)
_NAME_AFTER = frozenset(["def", "return", "=", "+=", "-=", "*=", "/=", "//=", "%=", "**="])
_CLOSING = frozenset(")]}")
_LAST_WORD = re.compile(r"(\w+|[^\w\s]+)\s*$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


def python_key_positions(before: str, pieces: list[str]) -> list[int]:
    """Indices into ``pieces`` (token texts following the text ``before``) at key positions."""
    keys: list[int] = []
    m = _LAST_WORD.search(before)
    prev = m.group(1) if m else ""
    line_start = not before or before.rstrip(" \t").endswith("\n")
    for i, piece in enumerate(pieces):
        word = piece.strip()
        if "\n" in piece:
            keys.append(i)
            line_start = not word or piece.rstrip(" \t").endswith("\n") or piece.endswith(" ")
            if not word:
                continue
        elif not word:
            continue
        elif (
            line_start or word in OPERATORS or word in _CLOSING or (prev in _NAME_AFTER and _NAME.match(word))
        ):
            keys.append(i)
        line_start = False
        prev = word.split()[-1] if word else prev
    return keys

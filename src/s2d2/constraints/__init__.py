"""Structured output: grammar constraints (JSON schema, JSON object, regex, choice, EBNF) on decoding.

:mod:`.spec` describes a constraint, :mod:`.compiler` compiles it once per model (xgrammar, an optional
dependency imported lazily), :mod:`.matcher` tracks one request's grammar state and makes its bitmask
rows, :mod:`.bitmask` applies them to logits on the device. The engine's hooks are in
:mod:`s2d2.engine.constrained`.
"""

from .compiler import MISSING_LIBRARY, CompiledConstraint, GrammarCache
from .spec import KINDS, OutputConstraint, constraint_of, from_response_format

__all__ = [
    "KINDS",
    "MISSING_LIBRARY",
    "CompiledConstraint",
    "GrammarCache",
    "OutputConstraint",
    "constraint_of",
    "from_response_format",
]

"""Scoring a ``tiny-code`` completion without running it: exact match against the canonical body.

The test split is scored by executing the problem's asserts in the sandbox (``s2d2 eval tiny-code``);
training selects checkpoints on dev by :func:`is_exact`, which runs nothing and is a lower bound of
passing (a different but correct body counts as wrong).
"""

from __future__ import annotations

__all__ = ["is_exact"]


def is_exact(completion: str, problem: dict) -> bool:
    """Whether ``completion`` is the problem's canonical body (trailing whitespace ignored)."""
    return completion.rstrip() == str(problem["answer"]).rstrip()

"""Incremental readers of streamed text hold back what may still become a tag."""

from __future__ import annotations


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (the characters a
    stream must hold back until the next piece says whether ``tag`` begins there)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0

"""Continuation pieces of a WordPiece vocabulary (the built-in model's: ``@@0`` continues a word).

A WordPiece decoder joins a continuation piece to the token before it and strips its prefix; as the
first token of a text there is nothing to join it to, and the tokenizer would write the prefix itself
(``"@@02"``). :func:`decoded` writes such a piece as its bare text (``"02"``), as it would read after
the word it continues, so no prefix ever reaches a returned text, token or log-probability key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def continuation_prefix(tokenizer: Any) -> str | None:
    """The continuation prefix of a WordPiece decoder (the built-in model's: ``@@``), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None or type(decoder).__name__ != "WordPiece":
        return None
    return decoder.prefix


def decoded(tokenizer: Any, ids: Sequence[int], prefix: str | None, **options: Any) -> str:
    """``tokenizer.decode(ids, **options)``, a first token that is a continuation piece written as its
    bare text (``prefix``: :func:`continuation_prefix`, None: decode as it is)."""
    text = tokenizer.decode(list(ids), **options)
    if prefix and text.startswith(prefix):
        first = next(iter(tokenizer.convert_ids_to_tokens(list(ids[:8]), skip_special_tokens=True)), "")
        if first.startswith(prefix):
            text = text[len(prefix) :]
    return text

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


def piece_texts(tokenizer: Any, vocab_size: int, prefix: str) -> list[str | None]:
    """What each token adds to a text the WordPiece ``tokenizer`` decodes, after a word: the text a
    constraint reads for it (index = token id; None for special tokens, which the text skips).

    A continuation piece adds its bare text; any other piece what the decoder writes after a plain word,
    its separating space included or not as the decoder's clean-up decides (``"."`` after a word reads
    ``"."``, not ``" ."``), so the constrained string is the returned one."""
    special = set(getattr(tokenizer, "all_special_tokens", []))
    vocab = tokenizer.get_vocab()
    out: list[str | None] = [None] * vocab_size
    ref = _plain_word(tokenizer, vocab, special)
    base = tokenizer.decode([ref]) if ref is not None else ""
    for text, i in vocab.items():
        if i >= vocab_size or text in special:
            continue
        if text.startswith(prefix):
            out[i] = text[len(prefix) :]
            continue
        out[i] = " " + text
        if ref is not None:
            joined = tokenizer.decode([ref, i])
            if joined.startswith(base) and joined[len(base) :].lstrip(" ") == text:
                out[i] = joined[len(base) :]
    return out


def _plain_word(tokenizer: Any, vocab: dict[str, int], special: set[str]) -> int | None:
    """A token the decoder writes as it is and joins to itself with one space (the context of
    :func:`piece_texts`), or None."""
    for text, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        plain = text not in special and text.isalpha() and len(text) > 2
        if plain and tokenizer.decode([i, i]) == f"{text} {text}":
            return i
    return None

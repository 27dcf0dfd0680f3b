"""Token log-probabilities in OpenAI's two wire formats, every token in one decoded form.

The engine reports one :class:`~s2d2.engine.logprobs.TokenLogprob` per committed token (the value, its
``source``: ``ar`` for the AR mode's exact probability, ``draft`` for the drafter's, and the most likely
alternatives). Completions answer ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` plus
the extension list ``token_sources``; chat answers ``{"content": [{"token", "logprob", "bytes",
"top_logprobs", "source"}]}``.

**One vocabulary.** A token is shown everywhere (``tokens``, chat's ``token``, the ``top_logprobs`` keys
and tokens, ``bytes``) as the text it adds to the decoded text at its position (:class:`TokenTexts`), never
as its raw vocabulary piece: a word-piece continuation (``@@4`` after ``2``) shows ``4``, a word after
another shows its leading space. An alternative's text is what it would add at that same position
(decoded behind the :data:`CONTEXT_TOKENS` tokens before it). ``bytes`` are the UTF-8 bytes of that
text. A token that leaves a character incomplete (a byte of a multi-byte character) adds nothing yet
(``""``); the token that completes the character shows all of it. So the tokens of a completion
concatenate to its text wherever the tokenizer decodes prefix by prefix, and the chosen token is always
a key (completions) or a token (chat, when among the most likely) of its own ``top_logprobs`` entry.

**Collisions.** Two tokens can add the same text (special tokens all add ``""``; so do incomplete
characters). An entry keeps one value per text: the chosen token's own logprob where the chosen token's
text is among them, else the most likely token's with that text; so an entry may hold fewer alternatives
than asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The value OpenAI's formats cannot carry (-inf) is sent as this.
MIN_LOGPROB = -9999.0
#: Tokens decoded before an alternative to find the text it adds (decoders look a few tokens back).
CONTEXT_TOKENS = 8
REPLACEMENT = "\ufffd"


def _value(logprob: float) -> float:
    return logprob if logprob > MIN_LOGPROB else MIN_LOGPROB


def _stable(text: str) -> str:
    """``text`` without a trailing incomplete character (decoded as U+FFFD)."""
    return text.rstrip(REPLACEMENT)


@dataclass
class TokenTexts:
    """Each token's piece of the text, grown token by token (``decode``: token ids -> text)."""

    decode: Callable[[list[int]], str]
    ids: list[int] = field(default_factory=list)
    #: the decoded text so far, without a trailing incomplete character
    text: str = ""

    def _adds(self, before: str, full: str, tok: int) -> str:
        if full.startswith(before):
            return full[len(before) :]
        return _stable(self.decode([tok]))  # the tokenizer rewrote earlier text: the token on its own

    def alternatives(self, toks: Sequence[int]) -> list[str]:
        """The text each of ``toks`` would add after the tokens so far."""
        if not toks:
            return []
        window = self.ids[-CONTEXT_TOKENS:]
        before = _stable(self.decode(window)) if window else ""
        return [self._adds(before, _stable(self.decode([*window, int(t)])), int(t)) for t in toks]

    def add(self, new_ids: Sequence[int]) -> list[str]:
        """Append ``new_ids``; returns the text each adds."""
        return self.add_scored(new_ids, None)[0]

    def add_scored(
        self, new_ids: Sequence[int], tops: Sequence[Sequence[tuple[int, float]] | None] | None
    ) -> tuple[list[str], list[list[str] | None]]:
        """Append ``new_ids``; returns the text each adds and, per token, the text each of its ``tops``
        alternatives (``(token_id, logprob)``; None: none) would have added at its position."""
        pieces: list[str] = []
        top_texts: list[list[str] | None] = []
        for i, tok in enumerate(new_ids):
            top = tops[i] if tops is not None else None
            top_texts.append(None if top is None else self.alternatives([t for t, _ in top]))
            self.ids.append(int(tok))
            full = _stable(self.decode(self.ids))
            pieces.append(self._adds(self.text, full, int(tok)))
            self.text = full
        return pieces, top_texts


@dataclass
class Scored:
    """Tokens with their logprobs, one format-neutral list (``logprob`` None: the prompt's first token).
    ``top``: per token its ``(token_id, logprob)`` alternatives, most likely first; ``top_texts``: the
    text each alternative would add there (:class:`TokenTexts`)."""

    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)
    top_texts: list[list[str] | None] = field(default_factory=list)

    def extend(self, other: Scored) -> None:
        self.texts += other.texts
        self.ids += other.ids
        self.logprobs += other.logprobs
        self.sources += other.sources
        self.top += other.top
        self.top_texts += other.top_texts

    def alternatives(self, i: int, k: int) -> dict[str, float]:
        """Token ``i``'s ``k`` most likely alternatives as ``{text: logprob}``, most likely first, one value
        per text (see the module docstring: the chosen token's own where its text is among them)."""
        out: dict[str, float] = {}
        chosen, lp = self.texts[i], self.logprobs[i]
        for (tok, value), text in zip((self.top[i] or [])[:k], self.top_texts[i] or [], strict=False):
            if tok == self.ids[i]:
                text = chosen
            out.setdefault(text, _value(value))
        if chosen in out and lp is not None:
            out[chosen] = _value(lp)
        return out


def scored_tokens(texts: TokenTexts, new_ids: Sequence[int], entries: Sequence[Any]) -> Scored:
    """The engine's ``TokenLogprob`` entries of ``new_ids`` (aligned), their texts grown on ``texts``."""
    tops = [list(e.top) for e in entries]
    pieces, top_texts = texts.add_scored(new_ids, tops)
    return Scored(
        texts=pieces,
        ids=[int(e.token_id) for e in entries],
        logprobs=[float(e.logprob) for e in entries],
        sources=[str(getattr(e.source, "value", e.source)) for e in entries],
        top=tops,
        top_texts=top_texts,
    )


def completion_format(scored: Scored, top_k: int, offset: int = 0) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` object; ``offset``: where the first token's text starts."""
    offsets, pos = [], offset
    for piece in scored.texts:
        offsets.append(pos)
        pos += len(piece)
    tops: list[dict[str, float] | None] = []
    for i, lp in enumerate(scored.logprobs):
        if lp is None:
            tops.append(None)
            continue
        # the k most likely tokens and the chosen one (so logprobs=0 still names it), as vLLM answers
        entry = scored.alternatives(i, top_k)
        entry.setdefault(scored.texts[i], _value(lp))
        tops.append(entry)
    return {
        "tokens": list(scored.texts),
        "token_logprobs": [None if lp is None else _value(lp) for lp in scored.logprobs],
        "top_logprobs": tops,
        "text_offset": offsets,
        "token_sources": list(scored.sources),
    }


def _top_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}


def chat_format(scored: Scored, top_k: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object: ``{"content": [...]}``, each entry with its ``source``."""
    content = []
    for i, (piece, lp) in enumerate(zip(scored.texts, scored.logprobs, strict=True)):
        entry = _top_entry(piece, lp if lp is not None else MIN_LOGPROB)
        entry["top_logprobs"] = [_top_entry(t, v) for t, v in scored.alternatives(i, top_k).items()]
        entry["source"] = scored.sources[i]
        content.append(entry)
    return {"content": content}


def prompt_logprobs_format(scored: Scored, top_k: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (the first: null) ``{token_id: {"logprob", "rank",
    "decoded_token"}}`` for the token itself and its ``top_k`` most likely alternatives. ``rank``: 1 for
    the most likely token; null for a prompt token outside the alternatives ``scored`` holds."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for i, (tok, lp) in enumerate(zip(scored.ids, scored.logprobs, strict=True)):
        if lp is None:
            out.append(None)
            continue
        top = scored.top[i] or []
        texts = scored.top_texts[i] or []
        rank = next((r + 1 for r, (t, _) in enumerate(top) if t == tok), None)
        entry = {str(tok): {"logprob": _value(lp), "rank": rank, "decoded_token": scored.texts[i]}}
        for r, ((t, v), text) in enumerate(zip(top[:top_k], texts, strict=False)):
            entry.setdefault(str(t), {"logprob": _value(v), "rank": r + 1, "decoded_token": text})
        out.append(entry)
    return out

"""Token log-probabilities in OpenAI's two wire formats, with each token's text.

The engine reports one :class:`~s2d2.engine.logprobs.TokenLogprob` per committed token (the value, its
``source``: ``ar`` for the AR mode's exact probability, ``draft`` for the drafter's, and the most likely
alternatives). Completions answer ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` plus
the extension list ``token_sources``; chat answers ``{"content": [{"token", "logprob", "bytes",
"top_logprobs", "source"}]}``. A token's text is what it adds to the decoded text (so the tokens of a
completion concatenate to its text wherever the tokenizer decodes prefix by prefix).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The value OpenAI's formats cannot carry (-inf) is sent as this.
MIN_LOGPROB = -9999.0


def _value(logprob: float) -> float:
    return logprob if logprob > MIN_LOGPROB else MIN_LOGPROB


@dataclass
class TokenTexts:
    """Each token's piece of the text, grown token by token (``decode``: token ids -> text)."""

    decode: Callable[[list[int]], str]
    ids: list[int] = field(default_factory=list)
    text: str = ""

    def add(self, new_ids: Sequence[int]) -> list[str]:
        pieces = []
        for tok in new_ids:
            self.ids.append(int(tok))
            full = self.decode(self.ids)
            pieces.append(full[len(self.text) :] if full.startswith(self.text) else self.decode([int(tok)]))
            self.text = full
        return pieces


@dataclass
class Scored:
    """Tokens with their logprobs, one format-neutral list (``logprob`` None: the prompt's first token)."""

    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)

    def extend(self, other: Scored) -> None:
        self.texts += other.texts
        self.ids += other.ids
        self.logprobs += other.logprobs
        self.sources += other.sources
        self.top += other.top


def scored_tokens(pieces: Sequence[str], entries: Sequence[Any]) -> Scored:
    """From the engine's ``TokenLogprob`` entries and the tokens' text pieces (aligned)."""
    return Scored(
        texts=list(pieces),
        ids=[int(e.token_id) for e in entries],
        logprobs=[float(e.logprob) for e in entries],
        sources=[str(getattr(e.source, "value", e.source)) for e in entries],
        top=[list(e.top) for e in entries],
    )


def completion_format(
    scored: Scored, token_text: Callable[[int], str], top_k: int, offset: int = 0
) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` object; ``offset``: where the first token's text starts."""
    offsets, pos = [], offset
    for piece in scored.texts:
        offsets.append(pos)
        pos += len(piece)
    tops: list[dict[str, float] | None] = []
    for tok, lp, top in zip(scored.ids, scored.logprobs, scored.top, strict=True):
        if lp is None:
            tops.append(None)
            continue
        # the k most likely tokens and the chosen one (so logprobs=0 still names it), as vLLM answers
        entry = {token_text(t): _value(v) for t, v in (top or [])[:top_k]}
        entry.setdefault(token_text(tok), _value(lp))
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


def chat_format(scored: Scored, token_text: Callable[[int], str], top_k: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object: ``{"content": [...]}``, each entry with its ``source``."""
    content = []
    for piece, lp, source, top in zip(scored.texts, scored.logprobs, scored.sources, scored.top, strict=True):
        entry = _top_entry(piece, lp if lp is not None else MIN_LOGPROB)
        entry["top_logprobs"] = [_top_entry(token_text(t), v) for t, v in (top or [])[:top_k]]
        entry["source"] = source
        content.append(entry)
    return {"content": content}


def prompt_scores(model: Any, prep: Any) -> list[Scored] | None:
    """Each prompt's tokens with their exact AR-mode logprobs (``echo`` with ``logprobs``), from
    ``model.score``; the first token has none (null, as OpenAI answers). None without ``logprobs``."""
    k = prep.logprobs
    if k is None:
        return None
    long = [p for p in prep.prompts if len(p) > 1]
    scores = iter(model.score([(p[:1], p[1:]) for p in long], top_logprobs=k) if long else [])
    out = []
    for ids in prep.prompts:
        texts = TokenTexts(model.decode_ids).add(ids)
        s = next(scores) if len(ids) > 1 else None
        lps: list[float | None] = [None] + (list(s.logprobs) if s is not None else [])
        top = s.top if s is not None and s.top is not None else [[] for _ in ids[1:]]
        tops: list[Any] = [None, *top]
        sources: list[str | None] = [None] + ["ar"] * (len(ids) - 1)
        out.append(Scored(texts, list(ids), lps, sources, tops))
    return out

"""Compiling output constraints into grammars (xgrammar), once per distinct constraint.

xgrammar is an optional dependency (``pip install s2d2[structured]``); it is imported here, lazily, the
first time a constraint is compiled. A :class:`GrammarCache` belongs to one model (its tokenizer and
vocabulary): every request with an equal :class:`~.spec.OutputConstraint` shares one compiled grammar,
so a long generation or a busy server never recompiles.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..word_pieces import continuation_prefix, piece_texts
from .automaton import NotRegular, choice_pattern, regex_dfa
from .liveness import COMPILE_BUDGET, COMPILE_DEPTH, Liveness, can_complete, writes_every_byte
from .regular import RegularLiveness, TokenTexts, TooLarge
from .spec import OutputConstraint
from .tool_calls import structural_tag

MISSING_LIBRARY = "structured output needs `pip install s2d2[structured]` (the xgrammar library)"
#: Compiled grammars a cache keeps (least recently used dropped first).
DEFAULT_CACHE_ENTRIES = 128


def xgrammar() -> Any:
    """The xgrammar module, or a one-line ConfigError saying how to install it."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ConfigError(MISSING_LIBRARY) from None
    return xgr


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar and the vocabulary it masks (``vocab_size`` columns of the model's logits)."""

    constraint: OutputConstraint
    grammar: Any
    vocab_size: int
    #: whether the vocabulary may add dead ends (it does not write every byte): the look-ahead runs
    lookahead: bool = True
    #: the exact dead-end analysis of a regular constraint (:mod:`.regular`; None: the bounded search)
    regular: RegularLiveness | None = field(default=None, compare=False, repr=False)
    #: the grammar's dead-end look-aheads, memoised for every request that shares it (:mod:`.liveness`)
    liveness: Liveness = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        live = Liveness(self.vocab_size, enabled=self.lookahead, regular=self.regular)
        object.__setattr__(self, "liveness", live)


def _choice_grammar(options: Sequence[str]) -> str:
    """EBNF for exactly one of ``options`` (each a quoted literal; JSON escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)


#: xgrammar's messages start with a time and a C++ source location: not for the user
_LOCATION = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


#: xgrammar 0.2's rule for the characters of a length-bounded JSON string admits raw control characters,
#: which JSON forbids (its unbounded string rule excludes them): the class, and the one JSON allows
_LOOSE_CHARS, _JSON_CHARS = r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]"


def json_schema_grammar(xgr: Any, schema: str) -> str:
    """EBNF of ``schema`` (compact JSON: no free whitespace) whose strings hold no raw control character."""
    text = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    return text.replace(_LOOSE_CHARS, _JSON_CHARS)


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = _LOCATION.sub("", lines[0] if lines else type(exc).__name__)
    return text if len(text) <= 200 else text[:197] + "..."


def _tokenizer_info(
    xgr: Any, tokenizer: Any, vocab_size: int, stops: list[int]
) -> tuple[Any, list[str | None]]:
    """xgrammar's view of the vocabulary, each token as the text it adds to the decoded output, and
    those texts (None: a special token, or a token that is no whole characters).

    A WordPiece decoder joins tokens with a space unless a token starts with its continuation prefix, and
    its clean-up drops the space before punctuation; xgrammar's own reading of such a vocabulary would
    see no spaces, so the grammar would constrain a different text than the one returned. Here every
    token reads as :func:`~s2d2.word_pieces.piece_texts` says the decoder writes it after a word: the
    constrained text is the decoded one after one leading space (:attr:`GrammarCache.lead`)."""
    prefix = continuation_prefix(tokenizer)
    if prefix is None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
        special = set(info.special_token_ids)
        texts = [None if i in special else _text(b) for i, b in enumerate(info.decoded_vocab)]
        return info, texts
    texts = piece_texts(tokenizer, vocab_size, prefix)
    special = getattr(tokenizer, "all_special_tokens", [])
    vocab = [t or "" for t in texts]
    for text in special:
        i = tokenizer.convert_tokens_to_ids(text)
        if isinstance(i, int) and 0 <= i < vocab_size:
            vocab[i] = text
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)
    return info, texts


def _text(piece: bytes | str) -> str | None:
    if isinstance(piece, str):
        return piece
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


class GrammarCache:
    """Compiles constraints for one tokenizer; ``compile`` returns the cached grammar when it can."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        *,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
    ):
        if tokenizer is None:
            raise ConfigError("structured output needs the model's tokenizer (this model has none)")
        xgr = xgrammar()
        info, texts = _tokenizer_info(xgr, tokenizer, vocab_size, list(stop_token_ids))
        #: the vocabulary as the grammar reads it, for the exact dead-end analysis (:mod:`.regular`)
        self.texts = TokenTexts(texts, list(stop_token_ids), vocab_size)
        self.vocab_size = vocab_size
        #: what the grammar's text has before the decoded text (a WordPiece vocabulary's first space);
        #: regex and choice constraints are compiled after it, so they match the decoded text
        self.lead = " " if continuation_prefix(tokenizer) is not None else ""
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        #: whether masks need the dead-end look-ahead (:func:`~.liveness.writes_every_byte`)
        self.lookahead = not writes_every_byte(list(info.decoded_vocab))
        self._entries: OrderedDict[OutputConstraint, CompiledConstraint] = OrderedDict()
        self.max_entries = max_entries
        #: grammars compiled (cache misses); a test reads it to show a long generation never recompiles
        self.compiles = 0

    def compile(self, constraint: OutputConstraint) -> CompiledConstraint:
        """The compiled grammar of ``constraint``; an invalid schema, regex or grammar is a ConfigError
        naming the problem."""
        hit = self._entries.get(constraint)
        if hit is not None:
            self._entries.move_to_end(constraint)
            return hit
        try:
            grammar = self._build(constraint)
        except ConfigError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses with long texts
            raise ConfigError(f"invalid {constraint.kind.replace('_', ' ')}: {_one_line(exc)}") from None
        regular = self._regular(constraint)
        self._check_vocabulary(constraint, grammar, regular)
        self.compiles += 1
        compiled = CompiledConstraint(constraint, grammar, self.vocab_size, self.lookahead, regular)
        self._entries[constraint] = compiled
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return compiled

    def _regular(self, c: OutputConstraint) -> RegularLiveness | None:
        """The exact dead-end analysis of a regex or choice (its whole product with the vocabulary
        explored here, once), or None: another kind, a regex the automaton does not model, a product
        past the bound (:mod:`.regular`), or a vocabulary that writes every byte (no dead ends)."""
        if not self.lookahead or c.kind not in ("regex", "choice"):
            return None
        source = (
            self._held_regex(c.source) if c.kind == "regex" else choice_pattern(self._held_options(c.source))
        )
        try:
            regular = RegularLiveness(regex_dfa(source), self.texts)
            regular.live(regular.start)
        except (NotRegular, TooLarge):
            return None
        return regular

    def _check_vocabulary(
        self, constraint: OutputConstraint, grammar: Any, regular: RegularLiveness | None
    ) -> None:
        """A grammar that no token sequence of the vocabulary can complete is a ConfigError: the exact
        analysis of a regular constraint decides it (``[0-9]+x`` where no token writes ``x`` after a
        digit); otherwise a bounded search (:func:`~.liveness.can_complete`) from its start finds a way
        to its end or proves there is none (the built-in model's vocabulary has no braces or quotes, so
        it cannot begin a JSON object). A vocabulary writing every byte only needs a first token."""
        xgr = xgrammar()
        matcher = xgr.GrammarMatcher(grammar)
        if regular is not None:  # exact: the start state of the product is live or it is not
            dead = not regular.live(regular.start)
        elif not self.lookahead:  # every byte is a token: whatever the grammar allows can be written
            bits = xgr.allocate_token_bitmask(1, self.vocab_size)
            matcher.fill_next_token_bitmask(bits, 0)
            dead = not bool(bits.any())
        else:
            dead = can_complete(matcher, self.vocab_size, COMPILE_BUDGET, COMPILE_DEPTH) is False
        if dead:
            raise ConfigError(
                f"this model's vocabulary cannot write any output the {constraint.kind.replace('_', ' ')} "
                "constraint allows (no sequence of its tokens completes it)"
            )

    def _held_regex(self, source: str) -> str:
        """The regex the grammar's text must match for the decoded text to match ``source``: the
        :attr:`lead` before it (``67|42`` as ``" (?:67|42)"``), or no lead where the first token writes
        none (a continuation piece, a full stop), when ``source`` cannot itself begin with the lead (so
        the two readings never overlap; a regex the automaton does not model keeps the lead only)."""
        if not self.lead:
            return source
        try:
            dfa = regex_dfa(source)
            bare = dfa.step(dfa.start, self.lead) < 0
        except NotRegular:
            bare = False
        return f"{self.lead}(?:{source})|(?:{source})" if bare else f"{self.lead}(?:{source})"

    def _held_options(self, options: Sequence[str]) -> list[str]:
        """A choice's options as the grammar's text reads them (:meth:`_held_regex`'s rule per option)."""
        held = [self.lead + o for o in options]
        if self.lead:
            held += [o for o in options if o and not o.startswith(self.lead)]
        return held

    def _build(self, c: OutputConstraint) -> Any:
        """The compiled grammar of ``c``. Regexes, choices and grammars are held to the decoded text, so
        they get :attr:`lead` before them as a whole (:meth:`_held_regex`; a grammar as the lead then
        its root); ``json_object`` is any JSON object (not any JSON value)."""
        comp, xgr = self._compiler, xgrammar()
        if c.kind == "json_schema":
            return comp.compile_grammar(json_schema_grammar(xgr, c.source))
        if c.kind == "json_object":
            return comp.compile_grammar(json_schema_grammar(xgr, '{"type":"object"}'))
        if c.kind == "regex":
            return comp.compile_regex(self._held_regex(c.source))
        if c.kind == "choice":
            return comp.compile_grammar(_choice_grammar(self._held_options(c.source)))
        if c.kind == "grammar":
            grammar = xgr.Grammar.from_ebnf(c.source)
            if self.lead:
                grammar = xgr.Grammar.concat(xgr.Grammar.from_ebnf(_choice_grammar([self.lead])), grammar)
            return comp.compile_grammar(grammar)
        if c.kind == "tool_calls":
            tag = structural_tag(c.source, lambda schema: json_schema_grammar(xgrammar(), schema))
            return comp.compile_structural_tag(json.dumps(tag))
        raise ConfigError(f"unknown constraint kind {c.kind!r}")

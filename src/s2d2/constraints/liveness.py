"""Dead ends of a grammar over a vocabulary: states no token sequence of the vocabulary can complete.

A grammar allows text; a vocabulary writes text in pieces. Where the grammar allows a piece after which
no piece continues it (the built-in model's vocabulary has ``" a"`` but nothing that writes ``"vocado"``
after it, so ``choice ["avocado"]`` may start with ``" a"`` and never finish), a row that took that
piece could never end. :class:`Liveness` removes such pieces from every bitmask row, by one of two
rules chosen per constraint:

- **exact** (regexes and choices, :mod:`.regular`): the constraint's character automaton times the
  vocabulary; a token is kept iff the automaton state after it is live. Every row of a live state keeps
  a token, so a row never takes a token after which nothing completes, and a constraint whose start is
  not live is refused before decoding (``[0-9]+x`` where no token writes an ``x`` after digits).
- **bounded** (JSON schemas, EBNF grammars, tool calls, and a regex the automaton does not model or
  whose product exceeds :data:`~.regular.MAX_STATES`): :func:`can_complete`, a depth-first search over
  the grammar's matcher and the vocabulary, at most :data:`LOOKAHEAD_BUDGET` matcher states and
  :data:`LOOKAHEAD_DEPTH` tokens deep per token checked; only rows allowing at most
  :data:`MAX_CHECKED_TOKENS` tokens are checked (the inside of a JSON string is kept as it is). This is
  the stated bound: a dead end deeper or wider than it is found only when the row reaches it (a 422,
  :class:`~.matcher.ConstraintDeadEnd`).

Either rule is a pure function of the state's token path, so every decoder (constrained AR, the lossless
presets, the baselines, S2D2 under any policy) masks the same tokens at the same state, and lossless
equals constrained AR. Results are memoised per compiled grammar (bounded: by token path), so requests
that share a constraint share them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from .regular import RegularLiveness, TooLarge

#: a bitmask row allowing more tokens than this is not pruned (its searches would cost too much a step)
MAX_CHECKED_TOKENS = 1024
#: matcher states one token's look-ahead may visit, and how deep it goes
LOOKAHEAD_BUDGET, LOOKAHEAD_DEPTH = 48, 32
#: the compile-time search (does the grammar's start state complete at all?): states and depth
COMPILE_BUDGET, COMPILE_DEPTH = 4096, 256
#: memoised token paths per compiled grammar
MEMO_ENTRIES = 1 << 15


def allowed_ids(bits: torch.Tensor, index: int, vocab: int) -> list[int]:
    """Token ids bitmask row ``index`` of int32 ``bits`` ``[n, words]`` allows (ascending)."""
    row = bits[index]
    shifts = torch.arange(32, dtype=torch.int32)
    ok = ((row.unsqueeze(-1) >> shifts) & 1).bool().view(-1)[:vocab]
    return torch.nonzero(ok).view(-1).tolist()


def clear_bit(bits: torch.Tensor, index: int, token: int) -> None:
    """Forbid ``token`` in bitmask row ``index`` (in place)."""
    word, bit = divmod(token, 32)
    value = int(bits[index, word]) & 0xFFFFFFFF & ~(1 << bit)
    bits[index, word] = value - (1 << 32) if value >= 1 << 31 else value


def can_complete(matcher: Any, vocab: int, budget: int, depth: int) -> bool | None:
    """Whether some token sequence takes ``matcher`` from its state to one where the grammar may end
    (see the module docstring for ``True`` / ``False`` / ``None``). The matcher is left as it was."""
    left = [budget]
    scratch = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)

    def search(d: int) -> bool | None:
        if matcher.is_terminated() or matcher.is_completed():
            return True
        left[0] -= 1
        if left[0] < 0 or d == 0:
            return None
        matcher.fill_next_token_bitmask(scratch, 0)
        unknown = False
        for t in allowed_ids(scratch, 0, vocab):
            if not matcher.accept_token(t):
                continue
            found = search(d - 1)
            matcher.rollback(1)
            if found:
                return True
            unknown = unknown or found is None
            if left[0] < 0:
                return None
            matcher.fill_next_token_bitmask(scratch, 0)  # the recursion overwrote it
        return None if unknown else False

    return search(depth)


def writes_every_byte(decoded_vocab: list[bytes]) -> bool:
    """Whether the vocabulary has a token for each of the 256 single bytes (a byte-level BPE's does):
    then any text the grammar allows can be continued byte by byte, and the vocabulary adds no dead end
    (the look-ahead is skipped; only the grammar's own start is searched at compile time)."""
    return len({t for t in decoded_vocab if len(t) == 1}) == 256


class Liveness:
    """Memoised look-aheads of one compiled grammar (see the module docstring), keyed by token path.
    ``enabled`` False (a vocabulary that writes every byte): rows are not pruned, only counted."""

    def __init__(
        self,
        vocab: int,
        max_entries: int = MEMO_ENTRIES,
        *,
        enabled: bool = True,
        regular: RegularLiveness | None = None,
    ):
        self.vocab = vocab
        self.enabled = enabled
        #: the exact analysis of a regular constraint (None: the bounded search only)
        self.regular = regular if enabled else None
        self.max_entries = max_entries
        #: keyed by the path's length and hash (a path may be thousands of tokens: not kept itself)
        self._memo: OrderedDict[tuple[int, int], bool] = OrderedDict()

    def dead(self, matcher: Any, path: tuple[int, ...]) -> bool:
        """Whether the state ``matcher`` is at (reached by ``path``) is proven a dead end."""
        key = (len(path), hash(path))
        hit = self._memo.get(key)
        if hit is None:
            hit = can_complete(matcher, self.vocab, LOOKAHEAD_BUDGET, LOOKAHEAD_DEPTH) is False
            self._memo[key] = hit
            if len(self._memo) > self.max_entries:
                self._memo.popitem(last=False)
        return hit

    def start_state(self) -> int:
        """The exact analysis's state before any output (-1: no exact analysis)."""
        return -1 if self.regular is None else self.regular.start

    def next_state(self, state: int, token: int) -> int:
        """The exact analysis's state after ``token`` from ``state`` (-1: unknown from here on)."""
        return -1 if self.regular is None or state < 0 else self.regular.next_state(state, token)

    def prune_row(
        self, matcher: Any, path: tuple[int, ...], bits: torch.Tensor, index: int, state: int = -1
    ) -> int:
        """Clear from bitmask row ``index`` (the matcher's next-token mask at ``path``, whose exact
        analysis state is ``state``, -1 if none) every token after which the state is a dead end;
        returns how many tokens the row still allows (exact or not :attr:`enabled`: 1 for a row that
        allows any, else 0)."""
        if not self.enabled:
            return int(bool(bits[index].any()))
        if state >= 0 and self.regular is not None:
            try:
                bits[index] &= self.regular.live_mask(state)
                return int(bool(bits[index].any()))
            except TooLarge:  # not after a compile that explored the product (.compiler): a safety net
                pass
        ids = allowed_ids(bits, index, self.vocab)
        if len(ids) > MAX_CHECKED_TOKENS:
            return len(ids)
        kept = len(ids)
        for t in ids:
            if not matcher.accept_token(t):
                continue  # a stop token: accepting it ends the grammar, never a dead end
            if not matcher.is_terminated() and self.dead(matcher, (*path, t)):
                clear_bit(bits, index, t)
                kept -= 1
            matcher.rollback(1)
        return kept

"""Dead ends of a grammar over a vocabulary: states no token sequence of the vocabulary can complete.

A grammar allows text; a vocabulary writes text in pieces. Where the grammar allows a piece after which
no piece continues it (the built-in model's vocabulary has ``" a"`` but nothing that writes ``"vocado"``
after it, so ``choice ["avocado"]`` may start with ``" a"`` and never finish), a row that took that
piece could never end. This module finds such dead ends by a bounded depth-first search over the
grammar's matcher and the vocabulary, and the bitmask filter built on it:

- :func:`can_complete`: from the matcher's state, does some token sequence reach a state where the
  grammar may end? ``True`` (found), ``False`` (every path within the search was a dead end, and the
  search covered all of them: proven) or ``None`` (the search ran out of its budget: not known).
- :func:`prune_row`: a bitmask row without the tokens after which :func:`can_complete` is ``False``.
  Only rows allowing at most :data:`MAX_CHECKED_TOKENS` tokens are checked (wide rows, the inside of a
  JSON string, say, are kept as they are: dead ends there are not found in advance). The rule is a pure
  function of the state's token path, so every decoder (constrained AR, the lossless presets, the
  baselines) masks the same tokens at the same state, and lossless equals constrained AR.

Results are memoised per compiled grammar by token path (:class:`Liveness`), so requests that share a
constraint share its searches.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

#: a bitmask row allowing more tokens than this is not pruned (its searches would cost too much a step)
MAX_CHECKED_TOKENS = 128
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
    value = int(bits[index, word]) & ~(1 << bit)
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

    def __init__(self, vocab: int, max_entries: int = MEMO_ENTRIES, *, enabled: bool = True):
        self.vocab = vocab
        self.enabled = enabled
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

    def prune_row(self, matcher: Any, path: tuple[int, ...], bits: torch.Tensor, index: int) -> int:
        """Clear from bitmask row ``index`` (the matcher's next-token mask at ``path``) every token after
        which the state is a proven dead end; returns how many tokens the row still allows (when not
        :attr:`enabled`: 1 for a row that allows any, else 0)."""
        if not self.enabled:
            return int(bool(bits[index].any()))
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

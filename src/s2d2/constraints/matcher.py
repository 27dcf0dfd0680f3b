"""One request's grammar state: which tokens the grammar allows next, given its committed output.

A :class:`GrammarState` wraps an xgrammar ``GrammarMatcher`` over the request's committed generated
tokens (``fed`` of them so far). The engine's host half asks it for bitmask rows: the next-token mask at
the first undecided position, and, for a drafted span, the mask at every position given the drafts
before it (the matcher walks the drafts, then rolls back to the committed prefix).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import RequestCannotEnd, S2D2Error
from .compiler import CompiledConstraint, xgrammar
from .liveness import clear_bit


class ConstraintViolation(S2D2Error):
    """A committed token the grammar does not allow (the engine never commits one; a bug if raised)."""


class ConstraintDeadEnd(RequestCannotEnd):
    """No token of the vocabulary continues the committed output within the grammar: the row cannot go
    on (a dead end the look-ahead of :mod:`.liveness` could not see in advance). The row fails alone."""


def bitmask_words(vocab_size: int) -> int:
    """32-bit words of one bitmask row over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarState:
    """The grammar matcher of one request, advanced over its committed generated tokens."""

    def __init__(self, compiled: CompiledConstraint):
        xgr = xgrammar()
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled.grammar)
        self.words = bitmask_words(compiled.vocab_size)
        #: generated tokens the matcher has consumed (all committed; stops growing once terminated)
        self.fed = 0
        #: those tokens (the token path the dead-end look-ahead is memoised by)
        self.path: tuple[int, ...] = ()
        #: the exact dead-end analysis's state after them (-1: none, :mod:`.liveness`)
        self.state = compiled.liveness.start_state()

    @property
    def terminated(self) -> bool:
        """The grammar ended and its stop token was accepted: nothing follows."""
        return self.matcher.is_terminated()

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume newly committed tokens; a token the grammar refuses raises ConstraintViolation."""
        m = self.matcher
        for t in tokens:
            if m.is_terminated():
                return
            if not m.accept_token(int(t)):
                raise ConstraintViolation(
                    f"generated token {int(t)} at output position {self.fed} breaks the "
                    f"{self.compiled.constraint.kind} constraint"
                )
            self.fed += 1
            self.path = (*self.path, int(t))
            self.state = self.compiled.liveness.next_state(self.state, int(t))

    def accepted_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from the committed state, each within the rows
        :meth:`masks` gives (so no dead end is entered); the state is unchanged."""
        if not tokens:
            return 0
        rows = self.masks(tokens, len(tokens))
        m, n = self.matcher, 0
        for i, t in enumerate(tokens):
            if m.is_terminated() or not _allows(rows, i, int(t)) or not m.accept_token(int(t)):
                break
            n += 1
        self._rollback(n)
        return n

    def forced_tokens(self, limit: int, avoid: frozenset[int] = frozenset()) -> list[int]:
        """The tokens the grammar forces from the committed state (each the one token it allows), at
        most ``limit``, stopping before a token of ``avoid``. State unchanged."""
        m, out = self.matcher, []
        row = torch.zeros((1, self.words), dtype=torch.int32)
        while len(out) < limit and not m.is_terminated():
            m.fill_next_token_bitmask(row, 0)
            only = _single_token(row[0])
            if only is None or only in avoid or not m.accept_token(only):
                break
            out.append(only)
        if out:
            m.rollback(len(out))
        return out

    def forced_fill(self, drafts: Sequence[int]) -> tuple[list[int], list[bool]]:
        """Jump-forward: ``drafts`` (consecutive positions from the committed prefix) with every position
        where the grammar allows exactly one token set to that token, walked while the grammar accepts;
        and which positions were forced. State unchanged. A forced token is the only one constrained AR
        could emit there, so a verification always accepts it."""
        m, out, forced, walked = self.matcher, list(drafts), [False] * len(drafts), 0
        row = torch.zeros((1, self.words), dtype=torch.int32)
        for i in range(len(out)):
            if m.is_terminated():
                break
            m.fill_next_token_bitmask(row, 0)
            only = _single_token(row[0])
            if only is not None:
                out[i], forced[i] = only, True
            if not m.accept_token(int(out[i])):
                break
            walked += 1
        if walked:
            m.rollback(walked)
        return out, forced

    def masks(self, drafts: Sequence[int], n_rows: int) -> torch.Tensor:
        """Host int32 bitmask ``[n_rows, words]``: row i allows the tokens the grammar accepts after the
        committed prefix and ``drafts[:i]``, less those after which the grammar is a proven dead end
        (:meth:`~.liveness.Liveness.prune_row`: the same rule for every decoder). Rows after a draft
        the row before refuses (or after the grammar ended) allow everything: a verification stops at
        or before that draft anyway. A first row that allows nothing raises ConstraintDeadEnd."""
        out = torch.full((n_rows, self.words), -1, dtype=torch.int32)
        m, walked, live = self.matcher, 0, self.compiled.liveness
        path, state = self.path, self.state
        for i in range(n_rows):
            if m.is_terminated():
                break
            m.fill_next_token_bitmask(out, i)
            if live.prune_row(m, path, out, i, state) == 0:
                if i == 0:
                    self._rollback(walked)
                    raise ConstraintDeadEnd(
                        f"no token of this model's vocabulary continues the "
                        f"{self.compiled.constraint.kind.replace('_', ' ')} constraint after "
                        f"{self.fed} generated tokens"
                    )
                clear_bit(out, i - 1, int(drafts[i - 1]))  # that draft leads nowhere: refused there
                out[i:] = -1
                break
            if i + 1 == n_rows or i >= len(drafts) or not _allows(out, i, int(drafts[i])):
                break
            if not m.accept_token(int(drafts[i])):
                break
            path = (*path, int(drafts[i]))
            state = live.next_state(state, int(drafts[i]))
            walked += 1
        self._rollback(walked)
        return out

    def _rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)


def _allows(bits: torch.Tensor, index: int, token: int) -> bool:
    word, bit = divmod(token, 32)
    return bool((int(bits[index, word]) >> bit) & 1)


def _single_token(row: torch.Tensor) -> int | None:
    """The one token a bitmask row ``[words]`` (int32) allows, or None when it allows several (or none)."""
    nonzero = torch.nonzero(row).flatten()
    if nonzero.numel() != 1:
        return None
    word = int(nonzero[0])
    bits = int(row[word]) & 0xFFFFFFFF
    if bits & (bits - 1):
        return None
    return word * 32 + bits.bit_length() - 1

"""Exact dead ends of a regular constraint: liveness over the product of its DFA and the vocabulary.

A state of the product is a state of the constraint's character automaton (:class:`~.automaton.Dfa`);
token t moves state d to ``dfa.walk(d, text(t))``, where ``text(t)`` is what t adds to the grammar's
text (:class:`TokenTexts`, the same strings the grammar matcher reads). A state is *live* when some
token sequence leads from it to an accepting state. :class:`RegularLiveness` answers that exactly:

- lazily: asked about a state, it explores the states reachable from it (each state's moves computed
  once, tokens grouped by their first character so a refused character skips its whole group), marks
  the live ones by walking the moves backwards from the accepting ones, and keeps the answer for every
  state it explored (the explored set is closed under moves, so each answer is final);
- within a bound: exploring more than ``max_states`` states, or walking more than :data:`MAX_MOVES`
  tokens, raises :class:`TooLarge` (the compiler asks about the start state once, which explores the
  whole product; past the bound it keeps the bounded search of :mod:`.liveness` for the constraint);
- as a bitmask: :meth:`RegularLiveness.live_mask` is the int32 row ``[words]`` of the tokens whose move
  from d reaches a live state (stop tokens always set: the grammar matcher allows them only where the
  constraint may end). ANDed with the matcher's own mask it leaves exactly the tokens after which the
  output can still complete, for every decoder alike.

Results live with the compiled grammar, so every request sharing a constraint shares them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .automaton import Dfa

#: product states one constraint may explore before the exact analysis gives way to the bounded search
MAX_STATES = 4096
#: token moves (a token walked from a state) the exploration may compute, all states together
MAX_MOVES = 4_000_000


class TooLarge(RuntimeError):
    """The product has more reachable states than the analysis explores."""


class TokenTexts:
    """A vocabulary as the grammar reads it, grouped for the product's moves: ``by_first[c]`` the
    (token id, text after c) of every token whose text starts with c; ``stops`` the stop tokens. Tokens
    without a text (special ones, empty ones, ones that are not whole characters) move nowhere."""

    def __init__(self, texts: Sequence[str | None], stop_ids: Sequence[int], vocab_size: int):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.stops = [int(t) for t in stop_ids if 0 <= int(t) < vocab_size]
        stop_set = set(self.stops)
        self.by_first: dict[str, list[tuple[int, str]]] = {}
        for i, text in enumerate(texts[:vocab_size]):
            if text and i not in stop_set:
                self.by_first.setdefault(text[0], []).append((i, text[1:]))


class RegularLiveness:
    """Exact, lazily computed liveness of one regular constraint over one vocabulary (module docstring)."""

    def __init__(self, dfa: Dfa, texts: TokenTexts, max_states: int = MAX_STATES):
        self.dfa, self.texts, self.max_states = dfa, texts, max_states
        self._moves: dict[int, dict[int, int]] = {}
        self._live: dict[int, bool] = {}
        self._masks: dict[int, torch.Tensor] = {}
        self._walked = 0

    @property
    def start(self) -> int:
        return self.dfa.start

    def moves(self, state: int) -> dict[int, int]:
        """Token id -> the state it leads to from ``state`` (tokens the constraint refuses left out)."""
        hit = self._moves.get(state)
        if hit is None:
            hit, dfa = {}, self.dfa
            for first, group in self.texts.by_first.items():
                d0 = dfa.step(state, first)
                if d0 < 0:
                    continue
                self._walked += len(group)
                if self._walked > MAX_MOVES:
                    raise TooLarge(f"more than {MAX_MOVES} token moves")
                for tok, rest in group:
                    d = dfa.walk(d0, rest) if rest else d0
                    if d >= 0:
                        hit[tok] = d
            self._moves[state] = hit
        return hit

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token`` (``Dfa.DEAD`` for a refused token, a stop token, or an unknown state)."""
        return Dfa.DEAD if state < 0 else self.moves(state).get(int(token), Dfa.DEAD)

    def live(self, state: int) -> bool:
        """Whether some token sequence completes the constraint from ``state`` (TooLarge past the bound)."""
        if state < 0:
            return False
        hit = self._live.get(state)
        if hit is not None:
            return hit
        seen, stack, back = {state}, [state], {}
        while stack:
            d = stack.pop()
            for nxt in set(self.moves(d).values()):
                back.setdefault(nxt, []).append(d)
                if nxt not in seen and nxt not in self._live:
                    seen.add(nxt)
                    stack.append(nxt)
                    if len(seen) > self.max_states:
                        raise TooLarge(f"more than {self.max_states} states")
        known = [d for d in back if self._live.get(d)]
        live = {d for d in seen if self.dfa.accepting(d)}
        frontier = [*live, *known]
        while frontier:
            for prev in back.get(frontier.pop(), ()):
                if prev not in live:
                    live.add(prev)
                    frontier.append(prev)
        for d in seen:
            self._live[d] = d in live
        return self._live[state]

    def live_mask(self, state: int) -> torch.Tensor:
        """Int32 bitmask row ``[words]``: the tokens whose move from ``state`` reaches a live state, and
        the stop tokens (TooLarge past the bound)."""
        hit = self._masks.get(state)
        if hit is None:
            ok = torch.zeros(self.texts.words * 32, dtype=torch.bool)
            keep = [t for t, d in self.moves(state).items() if self.live(d)]
            ok[keep + self.texts.stops] = True
            weights = torch.tensor([1 << b for b in range(31)] + [-(1 << 31)], dtype=torch.int64)
            packed = (ok.view(-1, 32).to(torch.int64) * weights).sum(-1)
            hit = self._masks[state] = packed.to(torch.int32)
        return hit

"""A regular constraint as a character automaton: a regex (or a choice) as a lazily built DFA.

:func:`regex_dfa` parses a regex with Python's own regex parser into a Thompson NFA and returns a
:class:`Dfa` whose states are the epsilon-closed sets of NFA states, built one transition at a time as
they are asked for (a long bounded repeat such as ``[0-9]{40}`` never builds more states than are
walked). It is the automaton :mod:`.regular` multiplies with a vocabulary to find dead ends exactly.

Only the regular core is taken: literals, classes (``[...]``, ``\\d``, ``\\w``, ``\\s``, ``.``),
groups, alternation, greedy and lazy repeats and the anchors ``^`` / ``$`` at the ends (no-ops: a
constraint matches the whole output). Anything else (back-references, look-arounds, inline flags,
possessive repeats, repeats over :data:`MAX_REPEAT`, syntax Python reads differently) raises
:class:`NotRegular`, and the caller keeps the bounded search of :mod:`.liveness` for that constraint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

try:  # Python 3.11 names the parser re._parser (sre_parse before)
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

#: the largest count a bounded repeat may have (its copies are NFA states)
MAX_REPEAT = 1000
#: NFA states a constraint may compile to
MAX_NFA_STATES = 50_000

Pred = Callable[[str], bool]

_CATEGORIES: dict[object, Pred] = {
    _c.CATEGORY_DIGIT: lambda ch: "0" <= ch <= "9",
    _c.CATEGORY_NOT_DIGIT: lambda ch: not "0" <= ch <= "9",
    _c.CATEGORY_SPACE: lambda ch: ch in " \t\n\r\f\v",
    _c.CATEGORY_NOT_SPACE: lambda ch: ch not in " \t\n\r\f\v",
    _c.CATEGORY_WORD: lambda ch: ch == "_" or ch.isascii() and ch.isalnum(),
    _c.CATEGORY_NOT_WORD: lambda ch: not (ch == "_" or ch.isascii() and ch.isalnum()),
}
_ENDS = {_c.AT_BEGINNING, _c.AT_BEGINNING_STRING, _c.AT_END, _c.AT_END_STRING}


class NotRegular(ValueError):
    """The regex uses something this automaton does not model (see the module docstring)."""


def _class_pred(items: Sequence[tuple[object, object]]) -> Pred:
    """The predicate of a parsed character class ``[...]``."""
    negate, chars, ranges, cats = False, set(), [], []
    for op, av in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            chars.add(chr(av))  # type: ignore[arg-type]
        elif op is _c.RANGE:
            ranges.append((chr(av[0]), chr(av[1])))  # type: ignore[index]
        elif op is _c.CATEGORY and av in _CATEGORIES:
            cats.append(_CATEGORIES[av])
        else:
            raise NotRegular(f"class item {op}")

    def pred(ch: str) -> bool:
        hit = ch in chars or any(lo <= ch <= hi for lo, hi in ranges) or any(f(ch) for f in cats)
        return hit != negate

    return pred


class _Nfa:
    """Thompson NFA under construction: per state its epsilon moves and its (char or predicate, target)
    moves; state 0 is the start, :attr:`accept` the one accepting state."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[str | Pred, int]]] = []
        self.accept = -1

    def node(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise NotRegular("too many states")
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def seq(self, items: Sequence[tuple[object, object]], cur: int) -> int:
        for op, av in items:
            cur = self.item(op, av, cur)
        return cur

    def item(self, op: object, av: object, cur: int) -> int:  # noqa: C901 - one case per regex node
        if op is _c.LITERAL:
            return self._move(cur, chr(av))  # type: ignore[arg-type]
        if op is _c.NOT_LITERAL:
            refused = chr(av)  # type: ignore[arg-type]
            return self._move(cur, lambda ch: ch != refused)
        if op is _c.ANY:
            return self._move(cur, lambda ch: ch != "\n")
        if op is _c.IN:
            return self._move(cur, _class_pred(av))  # type: ignore[arg-type]
        if op is _c.AT and av in _ENDS:
            return cur
        if op is _c.SUBPATTERN:
            _group, add, remove, pattern = av  # type: ignore[misc]
            if add or remove:
                raise NotRegular("inline flags")
            return self.seq(pattern, cur)
        if op is _c.BRANCH:
            end = self.node()
            for alt in av[1]:  # type: ignore[index]
                start = self.node()
                self.eps[cur].append(start)
                self.eps[self.seq(alt, start)].append(end)
            return end
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            return self._repeat(*av, cur)  # type: ignore[misc]
        raise NotRegular(f"regex node {op}")

    def _move(self, cur: int, on: str | Pred) -> int:
        nxt = self.node()
        self.moves[cur].append((on, nxt))
        return nxt

    def _repeat(self, lo: int, hi: object, pattern: Sequence[tuple[object, object]], cur: int) -> int:
        unbounded = hi is _c.MAXREPEAT
        if lo > MAX_REPEAT or (not unbounded and hi > MAX_REPEAT):  # type: ignore[operator]
            raise NotRegular("repeat count")
        for _ in range(lo):
            cur = self.seq(pattern, cur)
        if unbounded:
            loop = self.node()
            self.eps[cur].append(loop)
            self.eps[self.seq(pattern, loop)].append(loop)
            return loop
        end = self.node()
        for _ in range(hi - lo):  # type: ignore[operator]
            self.eps[cur].append(end)
            cur = self.seq(pattern, cur)
        self.eps[cur].append(end)
        return end


class Dfa:
    """The lazily determinised automaton of a regex over characters. States are small ints (the start
    is :attr:`start`); :data:`DEAD` (-1) is the state no text leaves."""

    DEAD = -1

    def __init__(self, nfa: _Nfa):
        self._nfa = nfa
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._next: dict[tuple[int, str], int] = {}
        self.start = self._intern(self._closure([0]))

    @property
    def size(self) -> int:
        """States built so far."""
        return len(self._sets)

    def accepting(self, state: int) -> bool:
        return state >= 0 and self._nfa.accept in self._sets[state]

    def step(self, state: int, ch: str) -> int:
        """The state after ``ch`` from ``state`` (:data:`DEAD` when the regex refuses it)."""
        key = (state, ch)
        hit = self._next.get(key)
        if hit is None:
            moves = self._nfa.moves
            targets = [t for s in self._sets[state] for on, t in moves[s] if _takes(on, ch)]
            hit = self._intern(self._closure(targets)) if targets else self.DEAD
            self._next[key] = hit
        return hit

    def walk(self, state: int, text: str) -> int:
        """The state after ``text`` from ``state`` (:data:`DEAD` once refused)."""
        for ch in text:
            if state < 0:
                break
            state = self.step(state, ch)
        return state

    def _closure(self, states: Sequence[int]) -> frozenset[int]:
        seen, stack = set(states), list(states)
        while stack:
            for t in self._nfa.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    def _intern(self, states: frozenset[int]) -> int:
        hit = self._ids.get(states)
        if hit is None:
            hit = self._ids[states] = len(self._sets)
            self._sets.append(states)
        return hit


def _takes(on: str | Pred, ch: str) -> bool:
    return on == ch if isinstance(on, str) else on(ch)


def regex_dfa(pattern: str) -> Dfa:
    """The DFA of ``pattern`` matched as a whole (see the module docstring; NotRegular if unmodelled).
    Syntax Python reads otherwise than the grammar library (POSIX classes ``[[:digit:]]``, nested sets,
    ``{,n}``) is not modelled either."""
    if any(s in pattern for s in ("[:", "[[", "{,")):
        raise NotRegular("syntax read differently")
    try:
        parsed = _p.parse(pattern)
    except re.error as exc:
        raise NotRegular(str(exc)) from None
    if parsed.state.flags & ~(re.UNICODE | re.DEBUG):
        raise NotRegular("flags")
    nfa = _Nfa()
    nfa.node()
    nfa.accept = nfa.seq(list(parsed), 0)
    return Dfa(nfa)


def choice_pattern(options: Sequence[str]) -> str:
    """A regex matching exactly one of ``options`` (literal strings)."""
    return "|".join(re.escape(o) for o in options)

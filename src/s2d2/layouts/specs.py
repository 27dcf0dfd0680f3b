"""The visibility of every layout, as integers: per query a prefix, at most one window and itself.

Each function gives the :class:`~.mask_spec.MaskSpec` of one kind of segment among its new tokens (its
queries always see the whole cache besides), in :func:`~.mask_spec.spec_of`'s exact form
(:func:`~.mask_spec.canonical`), from ``4 x n`` integers: no ``n x n`` boolean is made. They are memoised
(read-only specs shared by rows): a kind's visibility depends only on the arguments, and a block's
start only through ``start % block_size`` (block- and token-causal relations are invariant under shifts
by whole blocks). The boolean builders of :mod:`s2d2.forward.masks` are the tests' oracle for each.
"""

from __future__ import annotations

import functools

import numpy as np

from .mask_spec import MaskSpec, canonical


def _prefixes(hi: np.ndarray) -> MaskSpec:
    """Each query sees the keys ``[0, hi)`` and nothing else."""
    return canonical(hi, hi, hi, np.zeros(hi.size, dtype=bool))


def _context_hi(n: int, phase: int, block_size: int, causal: bool) -> np.ndarray:
    """Prefix ends of ``n`` committed tokens whose first sits at ``phase`` within its block: token-causal
    (``j + 1``), else block-causal (the end of the query's block, within the ``n`` tokens)."""
    j = np.arange(n, dtype=np.int64)
    if causal:
        return j + 1
    return np.minimum(n, ((phase + j) // block_size + 1) * block_size - phase)


@functools.lru_cache(maxsize=256)
def causal(n: int) -> MaskSpec:
    """Token-causal ``n`` queries: query ``j`` sees new keys ``[0, j]``."""
    return _prefixes(np.arange(1, n + 1, dtype=np.int64))


@functools.lru_cache(maxsize=256)
def full(n: int) -> MaskSpec:
    """Every query sees every new key."""
    return _prefixes(np.full(n, n, dtype=np.int64))


@functools.lru_cache(maxsize=1024)
def context(n: int, phase: int, block_size: int, is_causal: bool) -> MaskSpec:
    """Committed tokens written to the cache (a prefill, a commit): token-causal with ``is_causal``, else
    block-causal with the first token at ``phase`` (= its position mod ``block_size``)."""
    return _prefixes(_context_hi(n, phase % block_size, block_size, is_causal))


@functools.lru_cache(maxsize=4096)
def draft(m: int, committed: tuple[bool, ...], block_size: int, is_causal: bool, phase: int) -> MaskSpec:
    """A draft forward: queries ``[m pending | fed block slots]`` (``committed`` has one flag a fed slot);
    the block starts at ``phase`` within its block. Pending rows see the pending tokens before them
    (block- or token-causally); block rows see every pending token and the whole fed block, except that
    with ``is_causal`` a committed slot sees only the fed slots up to itself."""
    k = np.arange(len(committed), dtype=np.int64)
    done = np.asarray(committed, dtype=bool) if is_causal else np.zeros(k.size, dtype=bool)
    pending = _context_hi(m, (phase - m) % block_size, block_size, is_causal)
    return _prefixes(np.concatenate([pending, np.where(done, m + k + 1, m + k.size)]))


@functools.lru_cache(maxsize=4096)
def lead(m: int, committed: tuple[bool, ...], first_mask: int) -> MaskSpec:
    """A causal draft (:func:`draft`) plus one last query, the AR-mode query of fed slot ``first_mask``:
    it sees the pending tokens, the fed slots before ``first_mask`` and itself."""
    inner = draft(m, committed, 1, True, 0)  # token-causal pending rows: the block size plays no part
    n = m + len(committed)
    hi = np.append(inner.hi.numpy(), m + first_mask)
    own = np.append(np.zeros(n, dtype=bool), True)
    return canonical(hi, hi, hi, own)


@functools.lru_cache(maxsize=4096)
def two_halves(n_first: int, slots: tuple[int, ...], groups: tuple[tuple[int, int, bool], ...]) -> MaskSpec:
    """A 2L verification, then pre-draft groups: first-half row ``j`` (of ``n_first``) sees first-half
    keys ``[0, j]``; the second-half row of slot ``s`` (one a slot of ``slots``, counted from the first
    half's start) sees ``[0, s)`` and itself; the rows of a group ``(rows, visible, head_alone)`` see the
    first ``visible`` first-half keys and the group, except that with ``head_alone`` its first row sees
    only itself of the group."""
    n2 = len(slots)
    parts_hi = [np.arange(1, n_first + 1, dtype=np.int64), np.asarray(slots, dtype=np.int64)]
    parts_lo = [parts_hi[0], parts_hi[1]]
    parts_whi = [parts_hi[0], parts_hi[1]]
    parts_self = [np.zeros(n_first, dtype=bool), np.ones(n2, dtype=bool)]
    at = n_first + n2
    for rows, visible, head_alone in groups:
        lo = np.full(rows, at, dtype=np.int64)
        whi = np.full(rows, at + rows, dtype=np.int64)
        own = np.zeros(rows, dtype=bool)
        if head_alone and rows:
            whi[0], own[0] = at, True
        parts_hi.append(np.full(rows, visible, dtype=np.int64))
        parts_lo.append(lo)
        parts_whi.append(whi)
        parts_self.append(own)
        at += rows
    return canonical(*(np.concatenate(p) for p in (parts_hi, parts_lo, parts_whi, parts_self)))


@functools.lru_cache(maxsize=1024)
def score(n_prefix: int, score_from: int, branches: tuple[int, ...]) -> MaskSpec:
    """Same-position scoring (queries ``[prefix | one MASK per prefix[score_from:] | per branch of b
    tokens: its first b - 1 tokens, then b MASKs]``): prefix rows are token-causal; the MASK of prefix
    token ``i`` sees prefix keys ``[0, i)`` and itself; a branch's token ``k`` sees the prefix and the
    branch's tokens ``[0, k]``; its MASK of token ``k`` sees the prefix, the branch's first ``k`` tokens
    and itself."""
    p = n_prefix
    s = np.arange(score_from, p, dtype=np.int64)
    hi = [np.arange(1, p + 1, dtype=np.int64), s]
    lo, whi = [hi[0], s], [hi[0], s]
    own = [np.zeros(p, dtype=bool), np.ones(s.size, dtype=bool)]
    at = p + s.size
    for b in branches:
        fed, slots = np.arange(b - 1, dtype=np.int64), np.arange(b, dtype=np.int64)
        hi.append(np.full(2 * b - 1, p, dtype=np.int64))
        lo.append(np.full(2 * b - 1, at, dtype=np.int64))
        whi.append(np.concatenate([at + fed + 1, at + slots]))
        own.append(np.concatenate([np.zeros(b - 1, dtype=bool), np.ones(b, dtype=bool)]))
        at += 2 * b - 1
    return canonical(*(np.concatenate(x) for x in (hi, lo, whi, own)))


@functools.lru_cache(maxsize=1024)
def shifted_score(n_prefix: int, fed: tuple[int, ...]) -> MaskSpec:
    """Shifted scoring (a plain causal forward per branch): prefix rows are token-causal; each branch's
    ``f`` fed tokens see the whole prefix and the branch's tokens up to their own."""
    p = n_prefix
    hi = [np.arange(1, p + 1, dtype=np.int64)]
    lo, whi = [np.zeros(p, dtype=np.int64)], [np.zeros(p, dtype=np.int64)]
    at = p
    for f in fed:
        hi.append(np.full(f, p, dtype=np.int64))
        lo.append(np.full(f, at, dtype=np.int64))
        whi.append(at + np.arange(1, f + 1, dtype=np.int64))
        at += f
    return canonical(*(np.concatenate(x) for x in (hi, lo, whi)), np.zeros(at, dtype=bool))

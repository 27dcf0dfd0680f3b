"""Attention masks as boolean ``[queries, keys]`` matrices, True = the query may see the key
(block-causal and token-causal context, a draft forward, the AR lead, a 2L and a fused verification,
scoring branches).

The forward never builds these: the layouts give each kind's visibility as integers
(:mod:`s2d2.layouts.specs`). They stay as the oracle the tests check the layouts against, and for
callers that describe a segment by a matrix (the transformers reference forward takes one made from a
spec: :func:`~s2d2.layouts.mask_spec.dense`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def block_causal(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Query at absolute position i sees key at j iff ``j // B <= i // B``."""
    return (k_pos[None, :] // block_size) <= (q_pos[:, None] // block_size)


def token_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Query at absolute position i sees key at j iff ``j <= i``."""
    return k_pos[None, :] <= q_pos[:, None]


def context_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int, causal: bool) -> torch.Tensor:
    """Mask among committed context tokens: token-causal for a causal cache, else block-causal."""
    return token_causal(q_pos, k_pos) if causal else block_causal(q_pos, k_pos, block_size)


def draft_mask(
    n_cache: int, n_pending: int, block_committed: torch.Tensor, *, block_size: int, causal: bool, start: int
) -> torch.Tensor:
    """Mask of a draft forward: queries ``[pending | block]``, keys ``[cache | pending | block]``.

    Pending rows see the cache and the pending tokens (block- or token-causally) but not the block.
    Block rows see the cache, all pending tokens and the whole block bidirectionally; with ``causal``
    the block's committed tokens see only block keys at or before their own slot (as AR mode would).
    """
    n_block = block_committed.numel()
    m = n_pending
    mask = torch.zeros(m + n_block, n_cache + m + n_block, dtype=torch.bool)
    mask[:, :n_cache] = True
    if m:
        pos = torch.arange(start - m, start)
        mask[:m, n_cache : n_cache + m] = context_mask(pos, pos, block_size, causal)
        mask[m:, n_cache : n_cache + m] = True
    inner = torch.ones(n_block, n_block, dtype=torch.bool)
    if causal:
        slots = torch.arange(n_block)
        inner[block_committed] = token_causal(slots, slots)[block_committed]
    mask[m:, n_cache + m :] = inner
    return mask


def verify2l_mask(n_cache: int, n_first: int, slots: list[int]) -> torch.Tensor:
    """The "2L" verify mask: queries ``[first half | one MASK per verified slot]``.

    Keys are ``[cache | first half | second half]``. First-half row j sees first-half keys <= j
    (token-causal); the second-half row for slot s sees first-half keys < s and only itself.
    """
    n_second = len(slots)
    mask = torch.zeros(n_first + n_second, n_cache + n_first + n_second, dtype=torch.bool)
    mask[:, :n_cache] = True
    idx = torch.arange(n_first)
    mask[:n_first, n_cache : n_cache + n_first] = token_causal(idx, idx)
    s = torch.tensor(slots, dtype=torch.long)
    mask[n_first:, n_cache : n_cache + n_first] = idx[None, :] < s[:, None]
    mask[n_first:, n_cache + n_first :] = torch.eye(n_second, dtype=torch.bool)
    return mask


def score_mask(n_prefix: int, score_from: int, branches: Sequence[int]) -> torch.Tensor:
    """The AR scoring mask of a same-position model (the first half of :func:`verify2l_mask`, per branch).

    Queries and keys are ``[prefix | one MASK per prefix[score_from:] | per branch: its tokens but the last,
    then one MASK per token]``. Prefix rows are token-causal; the MASK of prefix token i sees prefix keys
    < i and itself; a branch's token rows see the whole prefix and the branch's tokens up to their own;
    the MASK of branch token k sees the whole prefix, the branch's first k tokens and itself.
    """
    p, s = n_prefix, n_prefix - score_from
    n = p + s + sum(2 * b - 1 for b in branches)
    mask = torch.zeros(n, n, dtype=torch.bool)
    idx = torch.arange(p)
    mask[:p, :p] = token_causal(idx, idx)
    mask[p : p + s, :p] = idx[None, :] < torch.arange(score_from, p)[:, None]
    mask[p : p + s, p : p + s] = torch.eye(s, dtype=torch.bool)
    at = p + s
    for b in branches:
        fed, slots = torch.arange(b - 1), torch.arange(b)
        mask[at : at + 2 * b - 1, :p] = True
        mask[at : at + b - 1, at : at + b - 1] = token_causal(fed, fed)
        mask[at + b - 1 : at + 2 * b - 1, at : at + b - 1] = fed[None, :] < slots[:, None]
        mask[at + b - 1 : at + 2 * b - 1, at + b - 1 : at + 2 * b - 1] = torch.eye(b, dtype=torch.bool)
        at += 2 * b - 1
    return mask


def causal_mask(n: int) -> torch.Tensor:
    """Token-causal ``[n, n]``."""
    return torch.ones(n, n, dtype=torch.bool).tril_()


def draft_block_mask(
    m: int, committed: tuple[bool, ...], block_size: int, causal: bool, phase: int
) -> torch.Tensor:
    """:func:`draft_mask` among the new tokens of ``m`` pending tokens and fed block slots (``committed``:
    one flag a slot) whose block starts at ``phase`` within its block."""
    start = phase + block_size * (m // block_size + 1)
    done = torch.tensor(committed, dtype=torch.bool)
    return draft_mask(0, m, done, block_size=block_size, causal=causal, start=start)


def lead_mask(m: int, committed: tuple[bool, ...], lead: int) -> torch.Tensor:
    """A causal draft mask (queries ``[pending | fed block]``) plus one last row and key: the AR-mode
    query of fed slot ``lead`` sees the pending tokens, the fed slots before it and itself."""
    inner = draft_block_mask(m, committed, 1, True, 0)
    n = inner.shape[0]
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:n, :n] = inner
    mask[n, : m + lead] = True
    mask[n, n] = True
    return mask


def fused_mask(
    n_first: int, slots: Sequence[int], groups: Sequence[tuple[int, int, bool]]
) -> torch.Tensor:
    """The 2L verification mask of ``slots`` among the new tokens, followed by pre-draft groups
    (``(rows, visible first-half keys, head alone)`` each)."""
    two_l = verify2l_mask(0, n_first, list(slots))
    if not groups:
        return two_l
    head = n_first + len(slots)
    n = head + sum(rows for rows, _, _ in groups)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:head, :head] = two_l
    at = head
    for rows, visible, head_alone in groups:
        mask[at : at + rows, :visible] = True
        mask[at : at + rows, at : at + rows] = True
        if head_alone:
            mask[at, at + 1 : at + rows] = False
        at += rows
    return mask


def shifted_score_mask(n_prefix: int, fed: Sequence[int]) -> torch.Tensor:
    """A shifted family's scoring mask: the prefix token-causal, then per branch its ``f`` fed tokens,
    which see the whole prefix and the branch's tokens up to their own."""
    p = n_prefix
    n = p + sum(fed)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:p, :p] = causal_mask(p)
    at = p
    for f in fed:
        mask[at : at + f, :p] = True
        mask[at : at + f, at : at + f] = causal_mask(f)
        at += f
    return mask

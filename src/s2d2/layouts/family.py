"""Every kind of segment a family's row feeds, laid out from the family's traits: the one place that
reads them.

A family differs from the same-position layouts (:mod:`.layout`) only through its traits
(:class:`Traits`, which :class:`~s2d2.families.base.ModelInfo` has): its mask token; ``shifted``
(Fast-dLLM v2: logits predict the next position, re-aligned to block slots by :mod:`.shifted`); and
``prefill_bias`` (LLaDA2's official prefill: a block-causal prefill's mask added to the scores as
1.0/0.0, nothing masked; such a segment takes the grouped forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from . import layout, shifted
from .layout import Group, Layout, Tokens


class Traits(Protocol):
    """What the layouts read of a family."""

    mask_token_id: int
    shifted: bool
    prefill_bias: bool


def prefill(t: Traits, length: int, ids: torch.Tensor, *, block_size: int, causal: bool) -> Layout:
    """The prompt's tokens written at ``length...`` (:func:`~.layout.prefill`); a shifted family also
    saves the prediction for the position after them; with ``prefill_bias`` and a block-causal cache
    the mask is a bias (:attr:`~.layout.Layout.bias`)."""
    lay = layout.prefill(length, ids, block_size=block_size, causal=causal)
    if t.shifted:
        lay = shifted.prefill(lay, length)
    return lay._replace(bias=True) if t.prefill_bias and not causal else lay


def commit(t: Traits, length: int, ids: torch.Tensor, *, block_size: int, causal: bool) -> Layout:
    """Committed output written as the prefill is, but never with a prefill bias: it is cached as a
    draft's pending tokens were."""
    return prefill(t, length, ids, block_size=block_size, causal=causal)._replace(bias=False)


def draft(
    t: Traits, length: int, pending: Tokens, block: Tokens, *, start: int, block_size: int, causal: bool,
    cached: int = 0, extend: bool = False, lead: int | None = None,
) -> Layout:  # fmt: skip
    """A draft (:func:`~.layout.draft`). A shifted family's block is never partly cached (slot 0's
    prediction comes from the position before the block): ``cached`` must be 0, ``extend`` is ignored
    and there is no lead."""
    if t.shifted:
        assert cached == 0, "a shifted model's block is not cached in parts"
        assert lead is None, "a shifted model's slot 0 draft is already the AR prediction"
        lay = layout.draft(t.mask_token_id, length, pending, block, start=start, block_size=block_size,
                           causal=causal)  # fmt: skip
        return shifted.draft(lay, len(pending), start)
    return layout.draft(t.mask_token_id, length, pending, block, start=start, block_size=block_size,
                        causal=causal, cached=cached, extend=extend, lead=lead)  # fmt: skip


def lead(
    t: Traits, length: int, pending: Sequence[int], block: Sequence[int], *, start: int, cached: int = 0,
    extend: bool = False,
) -> Layout:  # fmt: skip
    """The AR lead alone (:func:`~.layout.lead_only`); same-position families only."""
    assert not t.shifted, "a shifted model's slot 0 draft is already the AR prediction"
    return layout.lead_only(t.mask_token_id, length, pending, block, start=start, cached=cached,
                            extend=extend)  # fmt: skip


def verify(
    t: Traits, length: int, filled: Tokens, *, start: int, slots: Sequence[int], cached: int = 0
) -> Layout:
    """The 2L verification of ``slots`` (first half ``filled[cached : max(slots)]``); a shifted family's
    is a plain token-causal forward (:func:`~.shifted.verify`)."""
    if t.shifted:
        assert cached == 0, "a shifted model's block is not cached in parts"
        return shifted.verify(length, filled, start=start, slots=slots)
    return layout.two_halves(t.mask_token_id, length, filled, start=start, slots=slots, cached=cached,
                             n_first=max(slots))  # fmt: skip


def fused(
    t: Traits, length: int, filled: Tokens, *, start: int, slots: Sequence[int], predrafts: Sequence[Group],
    cached: int = 0,
) -> Layout:  # fmt: skip
    """A fused verification (first half ``filled[cached : max(slots) + 1]``, then the pre-draft groups)."""
    return layout.two_halves(t.mask_token_id, length, filled, start=start, slots=slots, cached=cached,
                             n_first=max(slots) + 1, predrafts=predrafts)  # fmt: skip


def score(
    t: Traits, length: int, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int
) -> Layout:
    """AR-mode scoring of given tokens (:func:`~.layout.score`; a shifted family's:
    :func:`~.shifted.score`)."""
    if t.shifted:
        return shifted.score(length, prefix, branches, score_from=score_from)
    return layout.score(t.mask_token_id, length, prefix, branches, score_from=score_from)

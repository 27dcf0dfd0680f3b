"""Fused verification: the verification forward also drafts the next step (docs/METHOD.md section 8).

Only for the lossless family (strict acceptance, verification on every step, one-token quota, causal
cache, same-position predictions): there a step's outcome is "all of the span accepted" or "first
rejection at span index j, corrected to y", and the state of the block after each outcome is known
before the forward. A verification forward therefore carries, besides its 2L queries, pre-draft groups:

* all accepted and the block complete: the next block's masks, seeing the whole draft-filled block
  (the verification's token-causal first half, which is exactly the causal cache of that block);
* first rejection at span index j with correction y (for the ``predraft_tokens`` most likely y of the
  drafter's distribution): y at slot c = span[j] (token-causal) and masks after it;
* with ``predraft_tokens = 0``: slot c masked with the masks after it (an approximation: its drafts
  are judged by the next verification like any other).

Each group sees the cache and the first half's keys before its first slot, i.e. exactly what a fresh
draft forward after that outcome sees; the next step takes the group of the outcome that happened as its
draft logits and skips its draft forward. Rejection positions are the ``predraft_positions`` most likely
ones under the acceptance estimate: P(first rejection at j) = prod_{i<j} alpha_i * (1 - alpha_j).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..adapters.segment import Predraft
from .request import PendingVerify, Request


@dataclass
class GroupPlan:
    """One pre-draft group: ``slot`` None is the next block; else the rejection slot, with ``token`` the
    correction it assumes (None: the slot stays masked). ``first_slot`` is the block slot (of the block
    the group drafts) of its first row; ``rows`` its number of rows."""

    slot: int | None
    token: int | None
    first_slot: int
    rows: int


@dataclass
class PredraftLogits:
    """Draft logits for a block from a pre-draft group: ``logits`` ``[block length, vocab]``, rows
    aligned to slots (rows the group did not cover are zeros and never read)."""

    start: int
    logits: torch.Tensor
    #: False for stale drafts reused after a miss (not a pre-draft hit)
    hit: bool = True


def plan_groups(req: Request, p: PendingVerify) -> list[GroupPlan]:
    """The pre-draft groups of this step's verification (see the module docstring)."""
    cfg, slots = req.config, p.slots
    L = req.length
    plans: list[GroupPlan] = []
    last = slots[-1]
    next_start = req.start + L
    if last == L - 1 and next_start < req.limit and req.end is None and req.partial_cache:
        plans.append(GroupPlan(None, None, 0, min(cfg.block_size, req.info.max_length - next_start)))
    k = min(cfg.predraft_positions, len(slots))
    if k == 0:
        return plans
    alpha = p.features.alpha if p.features is not None else torch.full((len(slots),), 0.5)
    reach = torch.cat([torch.ones(1), torch.cumprod(alpha, 0)[:-1]])
    first_reject = reach * (1 - alpha)
    if slots[-1] == L - 1:
        first_reject[-1] = -1.0  # a correction at the block's last slot leaves nothing to pre-draft
    for j in torch.topk(first_reject, k).indices.sort().values.tolist():
        c = slots[j]
        if c == L - 1:
            continue
        if cfg.predraft_tokens == 0:
            plans.append(GroupPlan(c, None, c, L - c))
            continue
        row = p.probs[p.off + j].clone()
        row[int(p.drafts[p.off + j])] = -1.0  # the correction differs from the rejected draft
        for y in torch.topk(row, min(cfg.predraft_tokens, row.numel() - 1)).indices.tolist():
            plans.append(GroupPlan(c, int(y), c + 1, L - c))
    return plans


def predraft_inputs(req: Request, plans: list[GroupPlan]) -> list[Predraft]:
    """The adapter's view of the groups: tokens, positions, visible first-half keys, inner masks."""
    mask_id, out = req.info.mask_token_id, []
    for g in plans:
        if g.slot is None:
            ids = torch.full((g.rows,), mask_id, dtype=torch.long)
            pos = torch.arange(req.start + req.length, req.start + req.length + g.rows)
            visible = req.length - req.cached  # the whole first half (it starts at the cache point)
            out.append(Predraft(ids, pos, visible, torch.ones(g.rows, g.rows, dtype=torch.bool)))
            continue
        n_masks = req.length - g.first_slot
        head = [] if g.token is None else [g.token]
        ids = torch.tensor(head + [mask_id] * n_masks, dtype=torch.long)
        pos = req.start + torch.arange(g.slot, req.length)
        inner = torch.ones(ids.numel(), ids.numel(), dtype=torch.bool)
        if g.token is not None:
            inner[0, 1:] = False  # the committed correction sees only itself (token-causal)
        out.append(Predraft(ids, pos, g.slot - req.cached, inner))
    return out


def pick_group(
    req: Request, p: PendingVerify, group_rows: list[torch.Tensor], n_acc: int, correction: int | None
) -> PredraftLogits | None:
    """The pre-draft of the outcome that happened, as block-aligned draft logits; None on a miss."""
    vocab = group_rows[0].shape[-1] if group_rows else 0
    if correction is None:
        for g, rows in zip(p.groups, group_rows, strict=True):
            if g.slot is None:
                return PredraftLogits(req.start + req.length, rows)
        return None
    c = p.slots[n_acc]
    if c == req.length - 1:
        return None  # the correction completes the block: the next block needs a fresh draft
    pairs = list(zip(p.groups, group_rows, strict=True))
    exact = [(g, r) for g, r in pairs if g.slot == c and g.token == correction]
    approx = [(g, r) for g, r in pairs if g.slot == c and g.token is None]
    for g, rows in exact + approx:
        full = rows.new_zeros(req.length, vocab)
        full[g.slot :] = rows  # row t of the group is slot g.slot + t (the correction's row is unused)
        return PredraftLogits(req.start, full)
    return None


def stale_logits(req: Request, p: PendingVerify) -> PredraftLogits:
    """The step's own drafts as next-step draft logits (``reuse_stale``): log-probabilities at slots."""
    full = torch.zeros(req.length, p.probs.shape[-1])
    full[p.cand] = torch.log(p.probs.clamp_min(1e-30))
    return PredraftLogits(req.start, full, hit=False)

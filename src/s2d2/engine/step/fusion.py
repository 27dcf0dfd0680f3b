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

from ...forward.segment import Predraft
from ..draft_step import DraftStep, SlotDrafts
from ..request import Request


@dataclass
class GroupPlan:
    """One pre-draft group: ``slot`` None is the next block; else the rejection slot, with ``token`` the
    correction it assumes (None: the slot stays masked). ``first_slot`` is the block slot (of the block
    the group drafts) of its first row; ``rows`` its number of rows."""

    slot: int | None
    token: int | None
    first_slot: int
    rows: int

    def row_slots(self) -> list[int]:
        """The block slot each of the group's logit rows drafts (row t: ``slot + t``, or ``t`` for the
        next block)."""
        first = 0 if self.slot is None else self.slot
        return list(range(first, first + self.rows))


def plan_groups(req: Request, p: DraftStep, positions: int | None = None) -> list[GroupPlan]:
    """The pre-draft groups of this step's verification (see the module docstring); ``positions``
    rejection positions at most (default: the settings' ``predraft_positions``)."""
    cfg, slots, cur = req.config, p.span_slots, req.cursor
    L = cur.length
    plans: list[GroupPlan] = []
    next_start = cur.start + L
    if slots[-1] == L - 1 and next_start < req.limit and req.end is None and req.cache.partial:
        plans.append(GroupPlan(None, None, 0, min(cfg.block_size, req.info.max_length - next_start)))
    k = min(cfg.predraft_positions if positions is None else positions, len(slots))
    if k == 0:
        return plans
    # the selection runs on host float32 tensors: the same ranking (ties included) on every device
    alpha = torch.tensor(p.features.alpha if p.features is not None else [0.5] * len(slots))
    reach = torch.cat([torch.ones(1), torch.cumprod(alpha, 0)[:-1]])
    first_reject = reach * (1 - alpha)
    if slots[-1] == L - 1:
        first_reject[-1] = -1.0  # a correction at the block's last slot leaves nothing to pre-draft
    best = torch.topk(first_reject, k).indices.sort().values.tolist()
    for j in best:
        c = slots[j]
        if c == L - 1:
            continue
        if cfg.predraft_tokens == 0:
            plans.append(GroupPlan(c, None, c, L - c))
            continue
        drafted = p.drafts.drafts[p.span_offset + j]
        alts = [y for y in p.drafts.alternatives[p.span_offset + j] if y != drafted]
        for y in alts[: cfg.predraft_tokens]:
            plans.append(GroupPlan(c, int(y), c + 1, L - c))
    return plans


def predraft_inputs(req: Request, plans: list[GroupPlan]) -> list[Predraft]:
    """The adapter's view of the groups: tokens, positions, visible first-half keys (host lists)."""
    mask_id, out, cur = req.info.mask_token_id, [], req.cursor
    cached, end = req.cache.block_cached, cur.start + cur.length
    for g in plans:
        if g.slot is None:  # the next block: it sees the whole first half (from the cache point)
            out.append(Predraft([mask_id] * g.rows, list(range(end, end + g.rows)), cur.length - cached))
            continue
        head = [] if g.token is None else [g.token]  # a committed correction sees only itself
        ids = head + [mask_id] * (cur.length - g.first_slot)
        out.append(Predraft(ids, list(range(cur.start + g.slot, end)), g.slot - cached, bool(head)))
    return out


def pick_group(
    req: Request, p: DraftStep, group_drafts: list[SlotDrafts], n_acc: int, correction: int | None
) -> tuple[int, SlotDrafts] | None:
    """The pre-draft of the outcome that happened, as (block start, drafts by slot); None on a miss."""
    cur = req.cursor
    if correction is None:
        for g, drafts in zip(p.groups, group_drafts, strict=True):
            if g.slot is None:
                return cur.start + cur.length, drafts
        return None
    c = p.span_slots[n_acc]
    if c == cur.length - 1:
        return None  # the correction completes the block: the next block needs a fresh draft
    pairs = list(zip(p.groups, group_drafts, strict=True))
    exact = [d for g, d in pairs if g.slot == c and g.token == correction]
    approx = [d for g, d in pairs if g.slot == c and g.token is None]
    for drafts in exact + approx:
        return cur.start, drafts
    return None


def stale_drafts(req: Request, p: DraftStep) -> tuple[int, SlotDrafts]:
    """The step's own drafts for the next step (``reuse_stale``): the verification judges them again."""
    return req.cursor.start, p.drafts

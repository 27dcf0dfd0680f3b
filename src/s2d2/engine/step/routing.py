"""What a drafted step verifies or commits by rule: the routing decision, and the baseline rule's picks.

:func:`route` decides (through the row's policy) whether a drafted step verifies its span and how
(plain or fused); :func:`fallback_picks` names the candidates the baseline rule (static, dynamic or
entropy-bounded) commits to reach the step's quota. Both read the drafter's host values only.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ...decoding import functional as F
from ...decoding.policies import RouteFeatures
from ...decoding.syntax_view import SpanSource
from ..draft_step import DraftStep, VerifyMode
from ..request import Request
from .fusion import plan_groups


@functools.lru_cache(maxsize=1024)
def f32(x: float) -> float:
    """``x`` rounded to float32: comparing a float32 value with it on the host decides exactly as torch
    does comparing the float32 tensor with the Python number."""
    return float(np.float32(x))


def route(req: Request, p: DraftStep) -> None:
    """The routing decision of a drafted step: set ``p.mode`` (and the verification's input) to verify.

    A policy with a fixed decision (:attr:`~s2d2.decoding.policies.Policy.fixed`) gets no features
    unless fusion reads their scores (``p.features`` stays None)."""
    cfg, cur, v = req.config, req.cursor, p.drafts
    off, slots = p.span_offset, v.slots
    last = len(slots) - 1
    if slots[last] - slots[off] == last - off:  # consecutive to the end (a block's usual candidates)
        n = last - off + 1
    else:
        n = 1
        while off + n < len(slots) and slots[off + n] == slots[off] + n:
            n += 1
    p.span_len = n
    decision = req.policy.fixed
    if decision is None or cfg.fuse:
        p.features = _features(req, p, n)
        if decision is None:
            decision = req.policy.decide(p.features)
    if not decision:
        return
    p.mode = VerifyMode.FUSED if cfg.fuse else VerifyMode.PLAIN
    p.filled = list(cur.ids)
    for s, t, done in zip(slots, v.drafts, p.done, strict=True):
        if not done:  # a committed first candidate keeps its AR token
            p.filled[s] = t
    if p.mode == VerifyMode.FUSED and not (req.auto_plan and req.cache.partial):
        p.groups = plan_groups(req, p)  # a planned row's groups are the planner's (.planner)


def _features(req: Request, p: DraftStep, n: int) -> RouteFeatures:
    """What a policy (or fusion's group plan) reads of the span of ``n`` candidates from ``p.span_offset``."""
    cfg, cur, v, off = req.config, req.cursor, p.drafts, p.span_offset
    tau = f32(cfg.threshold)
    return RouteFeatures(
        span_len=n,
        alpha=None if v.alpha is None else v.alpha[off : off + n],
        norm_entropy=None if v.norm_entropy is None else v.norm_entropy[off : off + n],
        block_size=cfg.block_size,
        progress=cur.n_committed / cur.length,
        n_dynamic=sum(1 for c in v.conf[off:] if c > tau),
        config=cfg,
        source=None if req.policy.syntax is None else _source(req, p, n),
        syntax=req.policy.syntax,
    )


def _source(req: Request, p: DraftStep, n: int) -> SpanSource | None:
    """The span's token ids in its row, for a policy's static checks: the prompt, the committed tokens
    up to the span, its ``n`` drafted tokens up to and without a stop token. None when a position
    before the span is still masked (the text there is not known yet)."""
    cur, v, off = req.cursor, p.drafts, p.span_offset
    head = req.tokens[: cur.start] + cur.ids[: v.slots[off]]
    if req.info.mask_token_id in head[req.n_prompt :]:
        return None
    span, final = [], False
    for t in v.drafts[off : off + n]:
        if t in req.stop_set:
            final = True
            break
        span.append(t)
    return SpanSource(head[: req.n_prompt], head[req.n_prompt :], span, final)


def fallback_picks(req: Request, p: DraftStep) -> list[int] | None:
    """Indices into the step's candidates the baseline rule commits if the step ends now: none once the
    step's commits reach its quota (None), else :func:`top_up`'s."""
    return top_up(req, p) if p.n_committed < p.quota else None


def top_up(req: Request, p: DraftStep) -> list[int] | None:
    """Indices into the candidates the baseline rule commits to reach the quota (None: nothing to commit).

    The rules run on host float32 tensors of the drafter's values, so ties break as they always did."""
    n = len(p.done)
    if n == 1 and p.n_committed == 0:  # one candidate, nothing committed yet (AR, a block's last slot)
        return [0]
    rest = [i for i in range(n) if not p.done[i]]
    if not rest:
        return None
    need = p.quota - p.n_committed
    v = p.drafts
    if req.rule == "static":
        sel = F.select_static(torch.tensor([v.conf[i] for i in rest]), need)
    elif req.rule == "dynamic":
        sel = F.select_dynamic(torch.tensor([v.conf[i] for i in rest]), req.config.threshold, need)
    else:
        sel = F.select_entropy_bounded(torch.tensor([v.entropy[i] for i in rest]), req.config.gamma, need)
    return [rest[i] for i in sel.tolist()]

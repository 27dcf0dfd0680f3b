"""The step planner's view of its rows: which rows it plans, their query tokens as their settings stand,
their spans' acceptance estimates and expected tokens (host values of the previous step)."""

from __future__ import annotations

from collections.abc import Sequence

from ..draft_step import DraftStep, VerifyMode
from ..request import Action, Request
from ..request_limits import prefill_positions
from .choice_matrices import RowSpan


def plannable(req: Request) -> bool:
    """Whether the planner chooses this row's verification (see the module docstring)."""
    p = req.pending
    if not (req.auto_plan and req.action == Action.VERIFY and p is not None and p.mode is not None):
        return False
    return req.cache.partial and (p.plan is None or p.plan.drafted)


def span_alpha(p: DraftStep, n: int) -> list[float]:
    """The drafter's acceptance estimates over the first ``n`` positions of ``p``'s span (0.5 each
    where it gave none)."""
    a = p.drafts.alpha
    return [0.5] * n if a is None else a[p.span_offset : p.span_offset + n]


def expected_tokens(alpha: Sequence[float]) -> float:
    """Committed tokens a strict verification of a span with these acceptance estimates expects: the
    sum over positions of the probability that every earlier draft is accepted."""
    total, r = 0.0, 1.0
    for a in alpha:
        total += r
        r *= a
    return total


def fixed_tokens(req: Request, prefill_chunk: int) -> int:
    """Query tokens ``req``'s next forward feeds as its settings (or an earlier plan) say (as
    :meth:`~.runner.ModelRunner.segment` builds it)."""
    cache, st = req.cache, req.state
    if req.action == Action.PREFILL:
        B = req.config.block_size
        return max(0, min(cache.prompt_blocks, st.length + prefill_positions(prefill_chunk, B)) - st.length)
    if req.action in (Action.DRAFT, Action.POST):
        return req.draft_fed() + int(req.draft_lead() is not None)
    if req.action == Action.LEAD:
        return req.lead_fed()
    p = req.pending
    off = p.span_slots[0] - cache.block_cached
    if p.mode == VerifyMode.FUSED:
        return off + 2 * p.span_len + sum(g.rows for g in p.groups)
    return off + 2 * p.span_len - 1


def row_span(req: Request) -> RowSpan:
    """The planner's view of a plannable row: its pending step's routed span (an earlier plan's
    ``full_span``; the step restores it where this step's plan defers the row)."""
    p, cfg, cur = req.pending, req.config, req.cursor
    n = p.plan.full_span if p.plan is not None else p.span_len
    slots, L = p.drafts.slots[p.span_offset : p.span_offset + n], cur.length
    next_start = cur.start + L
    nxt = 0
    if cfg.fuse and slots[-1] == L - 1 and next_start < req.limit and req.end is None:
        nxt = min(cfg.block_size, req.info.max_length - next_start)
    return RowSpan(
        alpha=span_alpha(p, n),
        off=slots[0] - req.cache.block_cached,
        span0=slots[0],
        length=L,
        next_rows=nxt,
        positions=min(cfg.predraft_positions, n) if cfg.fuse else -1,
        branches=max(1, cfg.predraft_tokens),
        context=req.state.length,
        draft_tokens=L + 1,
    )


def plain_tokens(s: RowSpan) -> int:
    """Query tokens of a plain verification of the whole span."""
    return s.off + 2 * len(s.alpha) - 1


def verifying(req: Request) -> bool:
    """Whether ``req``'s next forward verifies drafts."""
    return req.action == Action.VERIFY and req.pending is not None

"""What each row needs from the logits of its forward: the queries of the step's device half.

:func:`queries` turns a row's action and block state into :class:`~.draft_math.DraftQuery` /
:class:`~.verify_math.VerifyQuery` objects over its logits ``[rows, vocab]`` (views where the slots are
consecutive, else a gather whose index tensor is made on the device); :func:`~.step.apply` consumes the
filled queries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from ...forward.segment import with_zero_rows
from ..draft_step import SlotDrafts
from ..request import Action, Request
from ..row_forward import RowForward
from .device import DeviceOps
from .device_math import DraftQuery, VerifyQuery


@dataclass
class RowWork:
    """One row's share of the step: its action and its queries to the device half."""

    req: Request
    action: Action
    #: the row's part of the forward (what it kept, the block slots it cached, its AR lead slot)
    forward: RowForward
    edit: DraftQuery | None = None
    draft: DraftQuery | None = None
    verify: VerifyQuery | None = None
    groups: list[DraftQuery] = field(default_factory=list)
    #: the AR-mode check of the draft forward's lead slot (a placeholder draft: strict acceptance rejects
    #: it and its correction is AR greedy's token there)
    lead: VerifyQuery | None = None

    @property
    def draft_queries(self) -> list[DraftQuery]:
        if self.draft is None:
            return self.groups
        return [self.draft, *self.groups] if self.groups else [self.draft]

    @property
    def verify_queries(self) -> list[VerifyQuery]:
        if self.lead is None:
            return [self.verify] if self.verify is not None else []
        return [self.verify, self.lead] if self.verify is not None else [self.lead]


def rows_at(dev: DeviceOps, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """``logits[slots]``: a view when the slots are consecutive, else a gather (index made on device)."""
    return _rows(dev, logits, slots)


def _rows(dev: DeviceOps, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
    if slots and slots[-1] - slots[0] == len(slots) - 1:
        return logits if len(slots) == logits.shape[0] else logits[slots[0] : slots[-1] + 1]
    return logits.index_select(0, dev.tensor(slots))


def _prob_rows(dev: DeviceOps, drafts: SlotDrafts, lo: int, hi: int) -> torch.Tensor | None:
    """The drafter's distributions at candidates ``lo .. hi - 1`` (None where they were not kept)."""
    if drafts.probs is None:
        return None
    return _rows(dev, drafts.probs, drafts.prob_rows_of(lo, hi))


def _edit_slots(req: Request, upto: int) -> list[int]:
    ids, mask_id = req.cursor.ids, req.info.mask_token_id
    return [s for s in range(req.cursor.first_generated, upto) if ids[s] != mask_id]


def _with_context(req: Request, q: DraftQuery | VerifyQuery, slots: list[int], block_ids: list[int]) -> None:
    """Give a query what the request's logit adjustments need (nothing when it has none). Pre-draft
    groups stay unadjusted: they only propose, and the verification applies the adjustments exactly."""
    if req.adjust.active:
        q.positions = [req.cursor.start + s for s in slots]
        q.context = req.generated_context(block_ids)


def queries(dev: DeviceOps, req: Request, raw: torch.Tensor, forward: RowForward) -> RowWork:
    """What ``req`` needs from the logits of its forward (``req.action``; ``forward``: the row's part of
    it, as the runner built it). ``raw``: the runner's rows of it, without the segment's zero rows; they
    are put back here, so that row ``i`` is block slot ``i``."""
    logits = dev.mark(with_zero_rows(raw, forward.segment.zero_rows))
    action = req.action
    work = RowWork(req, action, forward)
    cfg, cur = req.config, req.cursor
    context = req.adjust.active
    if cfg.editing_threshold is not None and action in (Action.DRAFT, Action.POST):
        upto = cur.candidate_limit if action == Action.DRAFT else cur.n_valid
        slots = _edit_slots(req, upto)
        if slots:
            work.edit = DraftQuery(req, _rows(dev, logits, slots), slots)
            _with_context(req, work.edit, slots, cur.ids)
    if action is Action.VERIFY:
        p = req.pending
        span, off = p.span_len, p.span_offset
        parts = logits.split([span] + [g.rows for g in p.groups]) if p.groups else (logits,)
        p_rows = None if p.drafts.probs is None else _prob_rows(dev, p.drafts, off, off + span)
        work.verify = VerifyQuery(req, parts[0], p.drafts.drafts[off : off + span], cfg.strict, p_rows)
        if context:
            _with_context(req, work.verify, p.span_slots, p.filled)
        if p.groups:
            alts = cfg.predraft_tokens + 1 if cfg.predraft_tokens else 0
            keep = req.tracer.steps is not None
            for g, rows in zip(p.groups, parts[1:], strict=True):
                work.groups.append(
                    DraftQuery(req, rows, g.row_slots(), alpha=True, alternatives=alts, keep_probs=keep)
                )
    elif action is Action.DRAFT:
        pol = req.policy
        work.draft = DraftQuery(
            req,
            _rows(dev, logits, cur.candidates),
            cur.candidates,
            entropy=req.rule == "eb",
            norm_entropy=pol is not None and pol.reads_entropy,
            alpha=pol is not None and (pol.reads_alpha or cfg.fuse or cfg.plan == "auto"),
            alternatives=cfg.predraft_tokens + 1 if cfg.fuse and cfg.predraft_tokens else 0,
            keep_probs=pol is not None and (not cfg.strict or req.tracer.steps is not None),
        )
        if context:
            _with_context(req, work.draft, cur.candidates, cur.ids)
        if forward.lead is not None:
            n = cur.length
            work.lead = VerifyQuery(req, logits[n : n + 1], [req.info.mask_token_id], True, None)
            if context:
                _with_context(req, work.lead, [forward.lead], cur.ids)
    elif action is Action.LEAD:
        work.lead = VerifyQuery(req, logits, [req.info.mask_token_id], True, None)
        if context:
            _with_context(req, work.lead, [forward.lead], cur.ids)
    return work


#: how a step fails one request alone (the engine's ``_fail``)
Fail = Callable[[Request, BaseException], None]


def each_alone(rows: Iterable[tuple], step: Callable[..., None], fail: Fail) -> None:
    """``step(req, *rest)`` for each ``(req, *rest)`` of ``rows`` (any iterable: a zip of columns is
    read as it goes): an error fails its request alone."""
    for row in rows:
        try:
            step(*row)
        except Exception as exc:  # one request's failure must not stop its batch-mates
            fail(row[0], exc)


def queries_alone(
    dev: DeviceOps, taken: Sequence[tuple[Request, RowForward, torch.Tensor]], fail: Fail
) -> list[RowWork]:
    """Each lane row ``(req, forward, logits)`` (the raw rows: no zero rows) handed back to the general
    step: its own :func:`queries` (a row whose queries cannot be made fails alone)."""
    works: list[RowWork] = []
    each_alone(taken, lambda req, fwd, lg: works.append(queries(dev, req, lg, fwd)), fail)
    return works

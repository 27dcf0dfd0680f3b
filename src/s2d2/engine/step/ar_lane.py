"""The common AR step of many rows at once: one draft query for them all, then a lean commit a row.

A row in the lane (its traits' lane, :class:`~..request.RowTraits`, decided at admission) decodes one
token a block (block size 1) with plain greedy settings: no policy, logit adjustments, grammar,
log-probabilities, trace, editing or AR lead. Its step
is always the same: draft the one masked slot, commit the draft, close the block, open the next one
(or finish). The lane computes every lane row's token in ONE registration over their logits (a view
where they tile the forward's output; :class:`~.lane_math.GreedyTokens`), taken in the step's one
transfer with every other query, and then does each row's bookkeeping without the general step's objects
(:class:`~.row_queries.RowWork`, :class:`~..draft_step.DraftStep`, the block loop's walk). Most of its
steps are steady (:func:`steady`, decided once as the row's part of the forward is built): the layout is
``[token, mask]`` and the commit writes only what moves (:func:`_steady_commit`).
:class:`Lane` collects a step's lane rows; where the step's batched queries fail, it hands them back to
the general step (:meth:`Lane.as_rows`), whose queries then run row by row.

It is the step (the one writer of a decoding row's cursor and cached length, docs/ARCHITECTURE.md): it
writes exactly what :func:`~.host.apply` and :func:`~.host.advance` write for such a row (a stop token
and the request's limit included), and falls back to :func:`~.host.advance` wherever the row leaves the
common path (prompt positions left to prefill, a next block that is not one masked slot).
``tests/engine/test_ar_lane.py`` holds it to that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..request import Action, Request
from ..row_forward import RowForward
from .device import DeviceOps
from .host import advance, close_block, finish, open_block
from .lane_math import GreedyTokens
from .logits_view import WHOLE_ROWS, Reader
from .row_queries import Fail, RowWork, queries_alone


def in_lane(req: Request, forward: RowForward) -> bool:
    """Whether this step of ``req`` (its forward built as ``forward``) is the lane's common AR step."""
    return req.lane == "ar" and req.action is Action.DRAFT and forward.lead is None and req.predraft is None


class Lane:
    """The lane's rows of one step, in order: ``(request, its part of the forward, its logits)``."""

    def __init__(self, reader: Reader = WHOLE_ROWS) -> None:
        #: how the rows' logits are read (whole rows, or their summaries)
        self.reader = reader
        self.taken: list[tuple[Request, RowForward, torch.Tensor]] = []
        self.drafts: GreedyTokens | None = None

    def take(self, req: Request, logits: torch.Tensor, forward: RowForward) -> bool:
        """Take ``req`` into the lane if this step of it is the lane's (:func:`in_lane`)."""
        if not (forward.steady or in_lane(req, forward)):
            return False
        self.taken.append((req, forward, logits))
        return True

    def checks(self, dev: DeviceOps) -> list[GreedyTokens]:
        """The lane's one registration of every row's token (none without rows)."""
        if not self.taken:
            return []
        taken = self.taken
        self.drafts = GreedyTokens([t[0] for t in taken], [dev.mark(t[2]) for t in taken], self.reader)
        return [self.drafts]

    def apply(self, fail: Fail) -> None:
        """Commit every lane row's token (the registration is read): :func:`apply_lane`."""
        if self.drafts is not None:
            rows, parts, _ = zip(*self.taken, strict=True)
            apply_lane(rows, parts, self.drafts.tokens, fail)

    def as_rows(self, dev: DeviceOps, fail: Fail) -> list[RowWork]:
        """The lane's rows handed back to the general step (:func:`~.row_queries.queries_alone`), the
        lane emptied: where the step's batched queries failed, each row's are run alone."""
        works = queries_alone(dev, self.taken, fail)
        self.taken, self.drafts = [], None
        return works


def apply_lane(
    rows: Sequence[Request], parts: Sequence[RowForward], drafts: Sequence[int], fail: Fail
) -> None:
    """Commit each lane row's token ``drafts[i]`` and find its next forward (an error fails its row
    alone). A steady row (:func:`steady`, decided as its part was built: ``RowForward.steady``) whose
    token ends nothing and whose next slot is masked takes the steady step written out
    (:func:`_steady_commit`); any other row :func:`_commit`."""
    for req, fwd, tok in zip(rows, parts, drafts, strict=True):
        try:
            start = req.cursor.start
            if (
                fwd.steady
                and start + 1 < req.limit
                and tok not in req.stop_set
                and req.end is None
                and req.tokens[start + 1] == req.info.mask_token_id
            ):
                _steady_commit(req, start, tok)
            else:
                _commit(req, fwd, tok)
        except Exception as exc:  # one request's failure must not stop its batch-mates
            fail(req, exc)


def steady(req: Request) -> bool:
    """Whether ``req``'s next forward is the AR lane's steady draft: a lane row (:func:`in_lane`'s
    conditions) whose open block is one masked slot past its prompt, drafted afresh (step 0 of unit 0),
    with one committed token pending before it and nothing of the block cached, on a family that is
    not shifted; what :func:`_commit` leaves a row whose next block it opens. Its layout is
    ``[token, mask]`` (:meth:`~..runner.model_runner.ModelRunner.layout`) and its commit
    :func:`_steady_commit`, unless a stop, the limit or a prefilled slot intervenes. Reads only."""
    cur, cache, info = req.cursor, req.cache, req.info
    mask_id = info.mask_token_id
    return (
        req.lane == "ar"
        and req.action is Action.DRAFT
        and cur.length == 1
        and cur.ids[0] == mask_id
        and cache.block_cached == 0
        and cache.restore_to is None
        and cache.state.length + 1 == cur.start
        and cur.first_generated == 0
        and cur.step == 0
        and cur.unit_id == 0
        and not cur.in_post
        and not req.ar_lead
        and req.predraft is None
        and mask_id not in req.stop_set
        and not info.shifted
    )


def _steady_commit(req: Request, start: int, tok: int) -> None:
    """:func:`_commit` of a steady row whose token ``tok`` ends nothing and whose next slot is masked: the
    token is committed at ``start``, the cached length grows by the pending token, the next block (one
    masked slot) is opened and drafted. The block loop's fields (:func:`~.host.open_block`,
    :func:`~.host.advance`) come back to the values they had (a steady row's), so only what moves is
    written: the token, the block's start, its slot list and the counters."""
    stats, cur = req.stats, req.cursor
    stats.query_tokens += 2
    stats.nfe_draft += 1
    stats.steps += 1
    stats.blocks += 1
    req.tokens[start] = tok
    cur.start = start + 1
    cur.ids = [req.info.mask_token_id]
    cur.n_valid = 1
    cur.candidates, cur.candidate_limit, cur.n_committed = [0], 1, 0
    req.cache.state.advance(1)  # the step's one advance of the cached length: the pending token


def _commit(req: Request, fwd: RowForward, tok: int) -> None:
    """:func:`~.host.apply` of a lane row's draft step, then :func:`~.host.advance`, written out."""
    seg, stats, cur, cache = fwd.segment, req.stats, req.cursor, req.cache
    # apply: the forward's accounting, the draft step (its one candidate committed), the cached length
    stats.query_tokens += seg.n
    stats.nfe_draft += 1
    cache.block_cached += fwd.extension
    stats.steps += 1
    cur.ids[0] = tok
    if req.info.shifted:  # slot 0's draft of a shifted model is AR's token, committed first
        cur.n_committed += 1
    cur.step += 1
    state = cache.state
    state.advance(seg.keep)
    if cache.prompt_blocks - state.length > cache.fold_limit:
        advance(req)
        return
    # advance: the block's one slot is decided (a stop token ends the output there); close the block
    if tok in req.stop_set:
        req.end = cur.start
    close_block(req)
    start = cur.start
    if start >= req.limit or req.end is not None:
        finish(req)
        return
    mask_id = req.info.mask_token_id
    if req.tokens[start] != mask_id or mask_id in req.stop_set:
        advance(req)  # not the lane's next block: the block loop decides
        return
    # open the next block (one masked slot) and draft it: what the block loop finds there
    open_block(req)
    cur.unit_id, cur.candidates, cur.candidate_limit, cur.n_committed = 0, [0], 1, 0
    req.action = Action.DRAFT

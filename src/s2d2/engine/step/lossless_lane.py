"""The common lossless step of many rows at once: their drafts in a few queries, their strict checks in one.

A row in the lane (its traits' lane, :class:`~..request.RowTraits`, decided at admission) drafts and
verifies every step with plain greedy settings: a policy whose decision is fixed to verify (``always``)
reading no scores, strict acceptance, no fusion, planner, logit adjustments, grammar, log-probabilities,
trace or editing, and a baseline rule that reads confidences only. Its steps alternate: a draft forward
(draft every candidate, route the span to verification) and a verification forward (accept the span's
prefix that equals AR greedy's tokens, commit the correction after it).

The lane computes the drafts of all its drafting rows in one registration per part of rows that fits
the float32 math at once (:class:`~.lane_math.GreedyDrafts`) and the AR-mode argmax of every verifying
row's span in ONE registration (:class:`~.lane_math.StrictCheck`), taken in the step's one transfer with
every other query. Each row's bookkeeping then skips the general step's objects
(:class:`~.row_queries.RowWork`, a query per row): its common draft step (nothing committed first), its
common verification (the quota reached, nothing to top up) and the block loop's walk after it where its
outcome is known (the block's next draft, or the block closed) are written out, setting exactly the fields
the general step's functions set for such a row (:func:`~.host.draft_step` with :func:`~.routing.route`,
:func:`~.host.accept_span` with :func:`~.host.finish_step`, :func:`~.host.advance`); any other step or
walk is those functions themselves, so the lane writes exactly what :func:`~.host.apply` writes. On the
host, right after a forward, each object a row touches and each distinct call costs far more than its
work (the forward leaves the caches cold), so these paths touch only what moves.
``tests/engine/test_lossless_lane.py`` holds it to that.
"""

from __future__ import annotations

import torch

from ...decoding import functional as F
from ..block_cursor import BlockCursor
from ..draft_step import DraftStep, SlotDrafts, VerifyMode
from ..request import Action, Request
from ..row_forward import RowForward
from .device import DeviceOps
from .host import accept_span, advance, close_block, draft_step, finish_step
from .lane_math import GreedyDrafts, StrictCheck
from .logits_view import WHOLE_ROWS, Reader
from .row_queries import Fail, RowWork, queries_alone


def in_lane(req: Request, forward: RowForward) -> bool:
    """Whether this step of ``req`` (its forward built as ``forward``) is the lane's: a draft without an
    AR lead or pre-drafts, or a plain verification the planner did not choose."""
    if req.lane != "lossless":
        return False
    if req.action is Action.DRAFT:
        return forward.lead is None and req.predraft is None
    if req.action is Action.VERIFY:
        p = req.pending
        return p.mode is VerifyMode.PLAIN and not p.groups and p.plan is None
    return False


class LosslessLane:
    """The lane's rows of one step, in order, with their parts of the forward and their logits."""

    def __init__(self, reader: Reader = WHOLE_ROWS) -> None:
        #: how the rows' logits are read (whole rows, or their summaries)
        self.reader = reader
        self.drafting: list[tuple[Request, RowForward, torch.Tensor]] = []
        self.verifying: list[tuple[Request, RowForward, torch.Tensor]] = []
        #: the verifying rows' spans of drafts, concatenated in row order, and their lengths
        self.spans: list[int] = []
        self.sizes: list[int] = []
        self.draft: GreedyDrafts | None = None
        self.check: StrictCheck | None = None

    def take(self, req: Request, logits: torch.Tensor, forward: RowForward) -> bool:
        """Take ``req`` into the lane if this step of it is the lane's (:func:`in_lane`); a verifying
        row's span of drafts is read as it is taken."""
        if not in_lane(req, forward):
            return False
        if req.action is Action.DRAFT:
            self.drafting.append((req, forward, logits))
            return True
        p = req.pending
        off, n = p.span_offset, p.span_len
        self.spans += p.drafts.drafts[off : off + n]
        self.sizes.append(n)
        self.verifying.append((req, forward, logits))
        return True

    def checks(self, dev: DeviceOps) -> list[GreedyDrafts | StrictCheck]:
        """The lane's batched device work: its drafting rows' :class:`GreedyDrafts` and its verifying
        rows' :class:`StrictCheck` (each only where the lane has such rows)."""
        self.draft = self._drafts(dev) if self.drafting else None
        self.check = self._check(dev) if self.verifying else None
        return [c for c in (self.draft, self.check) if c is not None]

    def _drafts(self, dev: DeviceOps) -> GreedyDrafts:
        rows = [(req, dev.mark(lg), f.segment.zero_rows) for req, f, lg in self.drafting]
        return GreedyDrafts(dev, rows, self.reader)

    def _check(self, dev: DeviceOps) -> StrictCheck:
        mask_id = self.verifying[0][0].info.mask_token_id
        rows = [dev.mark(lg) for _, _, lg in self.verifying]
        return StrictCheck(mask_id, rows, self.spans, self.sizes, self.reader)

    def apply(self, fail: Fail) -> None:
        """Every lane row's step from its filled results (an error fails its row alone)."""
        if self.draft is not None:
            g = self.draft
            for (req, fwd, _), drafts, conf in zip(self.drafting, g.drafts, g.conf, strict=True):
                try:
                    _drafted(req, fwd, drafts, conf)
                except Exception as exc:  # one request's failure must not stop its batch-mates
                    fail(req, exc)
        if self.check is not None:
            ch = self.check
            for (req, fwd, _), n_acc, corr in zip(self.verifying, ch.n_accepted, ch.corrections, strict=True):
                try:
                    _verified(req, fwd, n_acc, None if corr < 0 else corr)
                except Exception as exc:
                    fail(req, exc)

    def as_rows(self, dev: DeviceOps, fail: Fail) -> list[RowWork]:
        """The lane's rows handed back to the general step (:func:`~.row_queries.queries_alone`), the
        lane emptied: where the step's batched queries failed, each row's are run alone."""
        works = queries_alone(dev, self.drafting + self.verifying, fail)
        self.drafting, self.verifying, self.draft, self.check = [], [], None, None
        self.spans, self.sizes = [], []
        return works


def _drafted(req: Request, fwd: RowForward, drafts: list[int], conf: list[float]) -> None:
    """:func:`~.host.apply` of a lane row's draft forward (its candidates' greedy ``drafts`` and their
    ``conf``): the draft step, routed to verification, then :func:`~.host.advance`. Where the forward
    commits nothing first (not a shifted model's slot 0) it is written out (:func:`_routed`)."""
    stats, cur, cache = req.stats, req.cursor, req.cache
    seg, cand = fwd.segment, cur.candidates
    stats.query_tokens += seg.n
    stats.nfe_draft += 1
    cache.block_cached += fwd.extension  # :func:`~.host._take_extension`
    values = SlotDrafts(cand, drafts, conf)
    if req.info.shifted and cand[0] == 0:  # slot 0's draft is AR's token, committed first
        draft_step(req, values)
        cache.state.advance(seg.keep)
        advance(req)
        return
    _routed(req, cur, values)
    st = cache.state
    st.advance(seg.keep)
    # :func:`~.host.advance` of a row with a verification pending: prefill first if the prompt needs it
    if cache.prompt_blocks - st.length > cache.fold_limit:
        req.action = Action.PREFILL
    else:
        req.action = Action.VERIFY


def _routed(req: Request, cur: BlockCursor, values: SlotDrafts) -> None:
    """:func:`~.host.draft_step` of a lane row that commits no first token: its step verifies the
    candidates' first consecutive run (:func:`~.routing.route` with the fixed decision to verify, plain:
    the lane's rows are not fused, traced or edited), the block filled with every draft as its input."""
    req.stats.steps += 1
    cand = values.slots
    n = len(cand)
    unit = req.unit
    quota = 1 if unit == 1 else F.quota(cur.step, unit, req.config.num_steps)  # the rule is never "eb"
    filled = list(cur.ids)
    first = cand[0]
    if cand[-1] - first == n - 1:  # consecutive (a block's usual candidates): one run, one slice
        span = n
        filled[first : first + n] = values.drafts
    else:
        span = 1
        while span < n and cand[span] == first + span:
            span += 1
        for s, t in zip(cand, values.drafts, strict=True):
            filled[s] = t
    req.pending = DraftStep(values, [False] * n, quota, span_len=span, mode=VerifyMode.PLAIN, filled=filled)


def _verified(req: Request, fwd: RowForward, n_acc: int, correction: int | None) -> None:
    """:func:`~.host.apply` of a lane row's verification forward: accept the span's first ``n_acc`` drafts
    and the correction after them, finish the step, advance the cached length once, then
    :func:`~.host.advance`. A step whose commits reach its quota (no top-up by rule) and whose policy
    reads no features is written out (:func:`_accepted`), and so is the block loop's walk where its
    outcome is known (:func:`_walk`)."""
    stats = req.stats
    seg = fwd.segment
    stats.query_tokens += seg.n
    stats.nfe_verify += 1
    p, req.pending = req.pending, None
    committed = n_acc + (correction is not None)
    if p.features is None and p.n_committed + committed >= p.quota:
        kept = _accepted(req, p, n_acc, correction)
        req.cursor.step += 1  # :func:`~.host.finish_step`: nothing to top up, no policy feedback
        req.cache.state.advance(seg.keep + kept)
        _walk(req, p, committed)
        return
    kept = accept_span(req, p, n_acc, correction)
    finish_step(req, p)
    req.cache.state.advance(seg.keep + kept)
    advance(req)


def _walk(req: Request, p: DraftStep, k: int) -> None:
    """:func:`~.host.advance` of a row whose verification (of step ``p``, from its first candidate,
    nothing else committed in the step) committed the first ``k`` of the cursor's candidates.

    Where the last walk's candidates were every masked slot of the block below its limit (no stop token
    decided then, so the limit is the block's valid length; one unit for the whole block, so none were
    left for a later unit) and the ``k`` committed tokens are neither stop nor mask tokens, the walk's
    outcome is known: with candidates left, the block's next draft in the same unit (the candidates
    after the committed ones, ``k`` more slots committed); with none, the block closes and the walk
    goes on from there. Anything else (a prefill due, a pre-draft, a stop token) is the walk's own."""
    cur, cache = req.cursor, req.cache
    cand = cur.candidates
    if (
        p.span_offset
        or cur.candidate_limit != cur.n_valid
        or req.unit < cur.length
        or req.predraft is not None
        or cache.prompt_blocks - cache.state.length > cache.fold_limit
    ):
        advance(req)
        return
    s0 = cand[0]
    done = cur.ids[s0 : s0 + k]  # the span's slots are consecutive from the first candidate
    if req.info.mask_token_id in done or not req.stop_set.isdisjoint(done):
        advance(req)
        return
    if k < len(cand):
        cur.candidates = cand[k:]
        cur.n_committed += k
        req.action = Action.DRAFT
        return
    close_block(req)  # every masked slot below the limit is decided (the lane's rows do not edit)
    advance(req)


def _accepted(req: Request, p: DraftStep, n_acc: int, correction: int | None) -> int:
    """:func:`~.host.accept_span` of a lane row's plain verification (no plan), writing the block and the
    counters only: the step ``p`` is done with (nothing reads its ``done`` or ``n_committed`` after a
    step that needs no top-up). Returns the positions the row's cache keeps."""
    ids, off, n = req.cursor.ids, p.span_offset, p.span_len
    v = p.drafts
    s0 = v.slots[off]  # the span's slots are consecutive (route measures it so)
    if n_acc:
        ids[s0 : s0 + n_acc] = v.drafts[off : off + n_acc]
    if correction is not None:
        ids[s0 + n_acc] = correction
    st = req.stats
    st.verify_steps += 1
    st.drafted += n
    st.accepted += n_acc
    st.full_accepts += int(n_acc == n)
    cache = req.cache
    if not cache.partial:
        return 0
    cached = cache.block_cached
    kept = min(s0 - cached + n_acc, s0 + n - 1 - cached)
    cache.block_cached += kept
    return kept

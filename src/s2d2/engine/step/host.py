"""The host half of a decode step: what a row does with its forward's results, then its block loop.

One algorithm serves AR (block size 1), the static / dynamic / entropy-bounded baselines and S2D2; they
differ only in how a step chooses what to commit. A row's S2D2 step spans two engine steps when it
verifies (its draft forward, then its verification forward); its batch-mates do not wait for it.

After the forward, :func:`~.row_queries.queries` says what the row needs from its logits
(:mod:`.device_math` computes every row's on the device and brings the values back in one transfer), and
:func:`apply` consumes them: route, verify, accept, fall back, edit (:mod:`.routing`, :mod:`.commits`),
then :func:`advance` walks the block loop (:mod:`.block_loop`) to the row's next forward. Forward
accounting: a finished block is committed to the cache inside the next block's first draft forward, so
commits cost no forward of their own.

The lanes' rows (:mod:`.lanes`) take fast branches of :func:`apply` written out for their common steps:
:func:`apply_ar_draft`, :func:`apply_plain_draft` and :func:`apply_plain_verify`. Each sets exactly the
fields the general functions set for such a row, touching only what moves (on the host right after a
forward, each object a row touches and each call costs far more than its work), and falls back to them
wherever the row leaves the common path. ``tests/engine/test_ar_lane.py`` and
``tests/engine/test_lossless_lane.py`` hold them to that.
"""

from __future__ import annotations

from ...decoding import functional as F
from ..block_cursor import BlockCursor
from ..draft_step import DraftStep, SlotDrafts, VerifyMode
from ..logprobs import LogprobSource
from ..request import Action, Request
from ..row_forward import RowForward
from .block_loop import close_block, finish, open_block, walk
from .commits import accept_plain, accept_span, at, commit_first, finish_step, record, verify_step
from .device_math import DraftQuery, VerifyQuery
from .grammar import jump_forward
from .routing import f32, route
from .row_queries import RowWork


def advance(req: Request) -> None:
    """Walk the block loop (:func:`~.block_loop.walk`) until the row needs a forward or is finished; a
    step the last fused verification pre-drafted runs here, without a draft forward."""
    walk(req, _take_predraft)


def _take_predraft(req: Request) -> bool:
    """Run this step on the drafts a fused verification left for it (no draft forward); False if none."""
    pre, req.predraft = req.predraft, None
    if pre is None or pre[0] != req.cursor.start:
        return False
    start, drafts, hit = pre
    try:
        values = drafts.pick(req.cursor.candidates)
    except KeyError:  # the group does not cover this step's candidates: draft afresh
        return False
    req.stats.predraft_hits += int(hit)
    draft_step(req, values, predrafted=True)  # a group's drafts or stale ones: no draft forward
    return True


def apply(work: RowWork) -> None:
    """Consume the row's results (its queries are filled), then :func:`advance`.

    The one place a decoding row's cached length grows: once, after its forward, by what the forward
    kept (``work.forward``) and what its verification accepted into the cache."""
    req, fwd = work.req, work.forward
    grown = fwd.segment.keep
    req.stats.query_tokens += fwd.n
    if work.action == Action.PREFILL:
        req.stats.nfe_prefill += 1
    elif work.action == Action.DRAFT:
        req.stats.nfe_draft += 1
        req.cache.block_cached += fwd.extension  # the committed slots the forward kept are cached now
        draft_step(req, work.draft.result, edit=work.edit, lead=work.lead)
    elif work.action == Action.LEAD:
        _lead_step(req, work.lead, fwd)
    elif work.action == Action.POST:
        req.stats.nfe_draft += 1
        req.tracer.begin_step(req.cursor.start, req.cursor.step)
        changed = _edit(req, work.edit.result) if work.edit is not None else 0
        req.cursor.post_left = req.cursor.post_left - 1 if changed else 0
    elif work.action == Action.VERIFY:
        req.stats.nfe_verify += 1
        grown += verify_step(req, work.verify, [g.result for g in work.groups])
    req.cache.state.advance(grown)
    advance(req)


def recomputed(req: Request, forward: RowForward) -> None:
    """A preempted row's forward rewrote the next chunk of its cache: it keeps it; once the cache is
    whole again the row resumes decoding."""
    req.stats.query_tokens += forward.n
    req.stats.nfe_recompute += 1
    req.cache.state.advance(forward.segment.keep)
    if req.cache.recompute_left == 0:
        req.cache.restore_to = None


def _edit(req: Request, res: SlotDrafts) -> int:
    """LLaDA2.1-style token editing: replace generated tokens whose prediction changed confidently."""
    tau, cur = f32(req.config.editing_threshold), req.cursor
    n = 0
    for i, (s, t, c) in enumerate(zip(res.slots, res.drafts, res.conf, strict=True)):
        if t != cur.ids[s] and c > tau:
            cur.ids[s] = t
            req.tracer.commit(cur.start + s, t, "edited", confidence=c)
            record(req, s, t, res.logprob and res.logprob[i], res.top and res.top[i], LogprobSource.DRAFT)
            n += 1
    req.stats.edits += n
    return n


def draft_step(
    req: Request,
    values: SlotDrafts,
    *,
    predrafted: bool = False,
    edit: DraftQuery | None = None,
    lead: VerifyQuery | None = None,
) -> None:
    """Take the drafts, commit the AR token of the first candidate where the forward gave it (a shifted
    model's slot 0, or the ``lead`` query), route; verify next or finish the step.

    ``predrafted``: the drafts came from the previous fused verification's pre-draft group."""
    cfg, cur = req.config, req.cursor
    req.stats.steps += 1
    if req.tracer.steps is not None:
        req.tracer.begin_step(cur.start, cur.step, predrafted=predrafted)
    if edit is not None:
        _edit(req, edit.result)
    cand = values.slots
    quota = 1 if req.rule == "eb" or req.unit == 1 else F.quota(cur.step, req.unit, cfg.num_steps)
    p = DraftStep(values, [False] * len(cand), quota)
    if lead is not None:
        commit_first(req, p, lead.correction, at(lead.logprobs or None, 0), at(lead.top or None, 0))
        req.stats.ar_leads += 1
    elif req.info.shifted and cand[0] == 0:
        # a shifted model predicts slot 0 from the previous position: that draft IS the AR token
        commit_first(req, p, values.drafts[0], at(values.logprob, 0), at(values.top, 0))
    if req.grammar is not None and cfg.jump_forward:
        jump_forward(req, p)
    if req.policy is not None and p.span_offset < len(cand):
        route(req, p)
        if p.verified:
            req.pending = p
            return
    finish_step(req, p)


def _lead_step(req: Request, lead: VerifyQuery, fwd: RowForward) -> None:
    """An AR-only step's forward (:attr:`Action.LEAD`, begun by the planner): commit AR mode's token at
    the lead slot; the committed tokens it fed are cached now."""
    st = req.stats
    st.nfe_verify += 1
    st.verify_steps += 1
    req.cache.block_cached += fwd.extension
    drafts = SlotDrafts([fwd.lead], [req.info.mask_token_id], [0.0])
    p = DraftStep(drafts, [False], 1, mode=VerifyMode.AR_ONLY)
    commit_first(req, p, lead.correction, at(lead.logprobs or None, 0), at(lead.top or None, 0))
    finish_step(req, p)


# --------------------------------------------------------------- the lanes' fast branches of apply
def apply_ar_draft(req: Request, fwd: RowForward, tok: int) -> None:
    """:func:`apply` of an AR lane row's draft step (its one masked slot's greedy token ``tok``), then
    :func:`advance`, written out. A steady row (``fwd.steady``: :func:`~.lanes.steady`, decided as its
    part was built) whose token ends nothing and whose next slot is masked writes only what moves: the
    token, the block's start and slot list, the counters, the cached length by the pending token; the
    block loop's other fields come back to the values they had."""
    start, cur, stats = req.cursor.start, req.cursor, req.stats
    mask_id = req.info.mask_token_id
    if (
        fwd.steady
        and start + 1 < req.limit
        and tok not in req.stop_set
        and req.end is None
        and req.tokens[start + 1] == mask_id
    ):
        stats.query_tokens += 2
        stats.nfe_draft += 1
        stats.steps += 1
        stats.blocks += 1
        req.tokens[start] = tok
        cur.start = start + 1
        cur.ids = [mask_id]
        cur.n_valid = 1
        cur.candidates, cur.candidate_limit, cur.n_committed = [0], 1, 0
        req.cache.state.advance(1)  # the step's one advance of the cached length: the pending token
        return
    seg, cache = fwd.segment, req.cache
    stats.query_tokens += seg.n
    stats.nfe_draft += 1
    cache.block_cached += fwd.extension
    stats.steps += 1
    cur.ids[0] = tok
    if req.info.shifted:  # slot 0's draft of a shifted model is AR's token, committed first
        cur.n_committed += 1
    cur.step += 1
    cache.state.advance(seg.keep)
    if cache.prompt_blocks - cache.state.length > cache.fold_limit:
        advance(req)
        return
    if tok in req.stop_set:  # the block's one slot is decided: a stop token ends the output there
        req.end = cur.start
    close_block(req)
    start = cur.start
    if start >= req.limit or req.end is not None:
        finish(req)
        return
    if req.tokens[start] != mask_id or mask_id in req.stop_set:
        advance(req)  # not the lane's next block: the block loop decides
        return
    open_block(req)  # the next block (one masked slot), drafted: what the block loop finds there
    cur.unit_id, cur.candidates, cur.candidate_limit, cur.n_committed = 0, [0], 1, 0
    req.action = Action.DRAFT


def apply_plain_draft(req: Request, fwd: RowForward, drafts: list[int], conf: list[float]) -> None:
    """:func:`apply` of a lossless lane row's draft forward (its candidates' greedy ``drafts`` and their
    ``conf``): the draft step, routed to verification, then :func:`advance`. Where the forward commits
    nothing first (not a shifted model's slot 0) it is written out (:func:`_route_all`)."""
    stats, cur, cache = req.stats, req.cursor, req.cache
    seg, cand = fwd.segment, cur.candidates
    stats.query_tokens += seg.n
    stats.nfe_draft += 1
    cache.block_cached += fwd.extension
    values = SlotDrafts(cand, drafts, conf)
    if req.info.shifted and cand[0] == 0:  # slot 0's draft is AR's token, committed first
        draft_step(req, values)
        cache.state.advance(seg.keep)
        advance(req)
        return
    _route_all(req, cur, values)
    st = cache.state
    st.advance(seg.keep)
    # advance of a row with a verification pending: prefill first if the prompt needs it
    req.action = Action.PREFILL if cache.prompt_blocks - st.length > cache.fold_limit else Action.VERIFY


def _route_all(req: Request, cur: BlockCursor, values: SlotDrafts) -> None:
    """:func:`draft_step` of a lossless lane row that commits no first token: it verifies the candidates'
    first consecutive run (:func:`~.routing.route` with the fixed decision to verify; lane rows are not
    fused, traced or edited), the block filled with every draft as its input."""
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


def apply_plain_verify(req: Request, fwd: RowForward, n_acc: int, correction: int | None) -> None:
    """:func:`apply` of a lossless lane row's verification forward: accept the span's first ``n_acc``
    drafts and the correction after them, finish the step, advance the cached length once, then
    :func:`advance`. A step whose commits reach its quota (no top-up) and whose policy reads no features
    is written out (:func:`~.commits.accept_plain`), and so is the block loop's walk where its outcome
    is known (:func:`walk_verified`)."""
    stats = req.stats
    seg = fwd.segment
    stats.query_tokens += seg.n
    stats.nfe_verify += 1
    p, req.pending = req.pending, None
    committed = n_acc + (correction is not None)
    if p.features is None and p.n_committed + committed >= p.quota:
        kept = accept_plain(req, p, n_acc, correction)
        req.cursor.step += 1  # finish_step: nothing to top up, no policy feedback
        req.cache.state.advance(seg.keep + kept)
        walk_verified(req, p, committed)
        return
    kept = accept_span(req, p, n_acc, correction)
    finish_step(req, p)
    req.cache.state.advance(seg.keep + kept)
    advance(req)


def walk_verified(req: Request, p: DraftStep, k: int) -> None:
    """:func:`advance` of a row whose verification (of step ``p``, from its first candidate, nothing else
    committed in the step) committed the first ``k`` of the cursor's candidates.

    Where the last walk's candidates were every masked slot of the block below its limit (no stop token
    decided then, so the limit is the block's valid length; one unit for the whole block) and the ``k``
    committed tokens are neither stop nor mask tokens, the outcome is known: with candidates left, the
    block's next draft in the same unit (``k`` more slots committed); with none, the block closes and
    the walk goes on from there. Anything else (a prefill due, a pre-draft, a stop token) is the walk's."""
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

"""The host half of a decode step: the block loop, and what a row does with its forward's results.

One algorithm serves AR (block size 1), the static / dynamic / entropy-bounded baselines and S2D2; they
differ only in how a step chooses what to commit. A row's S2D2 step spans two engine steps when it
verifies (its draft forward, then its verification forward); its batch-mates do not wait for it.

Per row, :func:`advance` walks the block loop until the row needs a forward (``req.action``) or is
finished. After the forward, :func:`~.row_queries.queries` says what the row needs from its logits
(:mod:`.device_math` computes every row's on the device and brings the values back in one transfer), and
:func:`apply` consumes them: route, verify, accept, fall back, edit (the routing decision and the
baseline rule's picks are :mod:`.step_routing`). All of it is host bookkeeping on
Python lists. Forward accounting: a finished block is committed to the cache inside the next block's
first draft forward, so commits cost no forward of their own.
"""

from __future__ import annotations

import time

from ...decoding import functional as F
from ...decoding.policies import SkipCheck
from ..draft_step import DraftStep, SlotDrafts, VerifyMode
from ..logprobs import LogprobSource, TokenLogprob
from ..request import Action, Request, Status
from ..row_forward import RowForward
from .device_math import DraftQuery, VerifyQuery
from .fusion import pick_group, stale_drafts
from .grammar import conforming_picks, forced_commits, jump_forward
from .routing import f32, fallback_picks, route
from .row_queries import RowWork


# ------------------------------------------------------------------------------------ the block loop
def open_block(req: Request) -> None:
    cfg, cur = req.config, req.cursor
    cur.length = min(cfg.block_size, req.info.max_length - cur.start)
    cur.ids = req.tokens[cur.start : cur.start + cur.length]
    cur.n_valid = cur.length if cfg.last_block == "full" else min(cur.length, req.limit - cur.start)
    cur.first_generated = max(0, req.n_prompt - cur.start)
    req.cache.block_cached = 0
    req.stats.blocks += 1
    cur.unit_id, cur.step, cur.in_post, cur.post_left = -1, 0, False, 0


def close_block(req: Request) -> None:
    cur = req.cursor
    req.tokens[cur.start : cur.start + cur.length] = cur.ids
    cur.start += cur.length
    cur.ids = None


def finish(req: Request) -> None:
    cap = min(req.n_prompt + req.config.max_new_tokens, len(req.tokens))
    if req.end is not None and req.end + 1 <= cap:
        out, reason = req.tokens[req.n_prompt : req.end + 1], "stop"
    else:
        out, reason = req.tokens[req.n_prompt : min(cap, req.limit)], "length"
    req.output_ids = out
    req.stats.finish_reason = reason
    req.stats.generated_tokens = len(out)
    if req.t_start is not None:
        req.stats.seconds = time.perf_counter() - req.t_start
    req.status, req.action = Status.FINISHED, None


def advance(req: Request) -> None:
    """Walk the block loop until the row needs a forward (sets ``req.action``) or is finished."""
    cfg, mask_id, cur, cache = req.config, req.info.mask_token_id, req.cursor, req.cache
    while True:
        st = cache.state
        if st is not None and cache.prompt_blocks - st.length > cache.fold_limit:
            req.action = Action.PREFILL  # the rest (at most fold_limit positions) rides in the first draft
            return
        if req.pending is not None:
            req.action = Action.VERIFY
            return
        if cur.ids is None:  # no open block
            if cur.start >= req.limit or req.end is not None:
                finish(req)
                return
            open_block(req)
        if cur.in_post:
            if cur.post_left > 0:
                req.action = Action.POST
                return
            close_block(req)
            continue
        ids, hi, first = cur.ids, cur.n_valid, cur.first_generated
        stop = None
        if not req.stop_set.isdisjoint(ids[first:hi]):
            stop = next(i for i in range(first, hi) if ids[i] in req.stop_set)
        if stop is not None:
            hi = stop
            if mask_id not in ids[first:stop]:
                req.end = cur.start + stop
                close_block(req)
                continue
        try:  # the masked slots below hi, from the first (the committed run before it is not walked)
            cand = [i for i in range(ids.index(mask_id, 0, hi), hi) if ids[i] == mask_id]
        except ValueError:
            cand = None
        if not cand:
            if cfg.editing_threshold is not None and cfg.post_steps > 0:
                cur.in_post, cur.post_left = True, cfg.post_steps  # edit-only passes, masks gone
                continue
            close_block(req)
            continue
        unit = req.unit
        u = cand[0] // unit
        if u != cur.unit_id:
            cur.unit_id, cur.step = u, 0
        end = (u + 1) * unit
        cur.candidates = cand if cand[-1] < end else [c for c in cand if c < end]
        cur.candidate_limit = hi
        if req.grammar is not None and cfg.jump_forward and forced_commits(req, cur.candidates):
            continue  # committed without a forward: walk the block again
        cur.n_committed = len(ids) - ids.count(mask_id)
        if req.predraft is not None and _take_predraft(req):
            continue
        req.action = Action.DRAFT
        return


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


# ----------------------------------------------------------------------------------- after a forward
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
        _take_extension(req, fwd.extension)
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
        grown += _verify_step(req, work.verify, [g.result for g in work.groups])
    req.state.advance(grown)
    advance(req)


def recomputed(req: Request, forward: RowForward) -> None:
    """A preempted row's forward rewrote the next chunk of its cache: it keeps it; once the cache is
    whole again the row resumes decoding."""
    req.stats.query_tokens += forward.n
    req.stats.nfe_recompute += 1
    req.state.advance(forward.segment.keep)
    if req.cache.recompute_left == 0:
        req.cache.restore_to = None


def _record(req: Request, slot: int, token: int, logprob: float | None, top, source: LogprobSource) -> None:
    if req.logprobs is not None and logprob is not None:
        req.logprobs[req.cursor.start + slot] = TokenLogprob(token, logprob, source, tuple(top or ()))


def _edit(req: Request, res: SlotDrafts) -> int:
    """LLaDA2.1-style token editing: replace generated tokens whose prediction changed confidently."""
    tau, cur = f32(req.config.editing_threshold), req.cursor
    n = 0
    for i, (s, t, c) in enumerate(zip(res.slots, res.drafts, res.conf, strict=True)):
        if t != cur.ids[s] and c > tau:
            cur.ids[s] = t
            req.tracer.commit(cur.start + s, t, "edited", confidence=c)
            _record(req, s, t, res.logprob and res.logprob[i], res.top and res.top[i], LogprobSource.DRAFT)
            n += 1
    req.stats.edits += n
    return n


def _draft_source(req: Request, slot: int) -> LogprobSource:
    """Block size 1 drafts are the AR mode's predictions, and so is a shifted model's slot 0."""
    return (
        LogprobSource.AR
        if req.config.block_size == 1 or (req.info.shifted and slot == 0)
        else (LogprobSource.DRAFT)
    )


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
        _commit_first(req, p, lead.correction, _at(lead.logprobs or None, 0), _at(lead.top or None, 0))
        req.stats.ar_leads += 1
    elif req.info.shifted and cand[0] == 0:
        # a shifted model predicts slot 0 from the previous position: that draft IS the AR token
        _commit_first(req, p, values.drafts[0], _at(values.logprob, 0), _at(values.top, 0))
    if req.grammar is not None and cfg.jump_forward:
        jump_forward(req, p)
    if req.policy is not None and p.span_offset < len(cand):
        route(req, p)
        if p.verified:
            req.pending = p
            return
    finish_step(req, p)


def _take_extension(req: Request, extension: int) -> None:
    """The block's committed slots a draft or lead forward kept (``extension``) are cached now."""
    req.cache.block_cached += extension


def _lead_step(req: Request, lead: VerifyQuery, fwd: RowForward) -> None:
    """An AR-only step's forward (:attr:`Action.LEAD`, begun by the planner): commit AR mode's token at
    the lead slot; the committed tokens it fed are cached now."""
    st = req.stats
    st.nfe_verify += 1
    st.verify_steps += 1
    _take_extension(req, fwd.extension)
    drafts = SlotDrafts([fwd.lead], [req.info.mask_token_id], [0.0])
    p = DraftStep(drafts, [False], 1, mode=VerifyMode.AR_ONLY)
    _commit_first(req, p, lead.correction, _at(lead.logprobs or None, 0), _at(lead.top or None, 0))
    finish_step(req, p)


def _commit_first(req: Request, p: DraftStep, tok: int, logprob: float | None, top) -> None:
    """Commit AR mode's token ``tok`` at the step's first candidate; the span to verify starts after it."""
    cur, slot = req.cursor, p.candidates[0]
    cur.ids[slot] = tok
    p.done[0] = True
    p.n_committed = p.span_offset = 1
    req.tracer.commit(cur.start + slot, tok, "ar", confidence=p.drafts.conf[0])
    _record(req, slot, tok, logprob, top, LogprobSource.AR)
    cur.n_committed += 1


def _at(values: list | None, i: int):
    return None if values is None else values[i]


def _verify_step(req: Request, vq: VerifyQuery, group_drafts: list[SlotDrafts]) -> int:
    """Accept the verified span left to right as the AR-mode check decided; returns the positions of
    the forward's keys the row's cache keeps (its committed run from the cache point, when the block is
    cached in parts)."""
    p = req.pending
    req.pending = None
    n_acc, correction = vq.n_accepted, vq.correction
    if req.policy is not None and req.policy.learns_from_checks:
        p.check = SkipCheck.of(fallback_picks(req, p) or [], p.span_offset, n_acc)
    kept = accept_span(req, p, n_acc, correction)
    req.tracer.verified(p.span_len, n_acc)
    _report_verification(req, p, vq)
    if p.mode == VerifyMode.FUSED:
        _after_fused_verify(req, p, group_drafts, n_acc, correction)
    elif p.plan is not None and correction is None:
        _reuse_stale(req, p)
    finish_step(req, p)
    return kept


def accept_span(req: Request, p: DraftStep, n_acc: int, correction: int | None) -> int:
    """Commit the verified span's first ``n_acc`` drafts and the ``correction`` after them (None: every
    draft was accepted) and count them; returns the positions the row's cache keeps (see
    :func:`_verify_step`)."""
    cur = req.cursor
    span, off = p.span_slots, p.span_offset
    if n_acc:  # a span's slots are consecutive (route measures it so; the planner keeps a prefix of it)
        cur.ids[span[0] : span[0] + n_acc] = p.drafts.drafts[off : off + n_acc]
        p.done[off : off + n_acc] = [True] * n_acc
    p.n_committed += n_acc
    if correction is not None:
        cur.ids[span[n_acc]] = correction
        p.done[p.span_offset + n_acc] = True
        p.n_committed += 1
    st = req.stats
    st.verify_steps += 1
    if p.plan is None or p.plan.drafted:
        st.drafted += p.span_len
        st.accepted += n_acc
        st.full_accepts += int(n_acc == p.span_len)
    kept = 0
    if req.cache.partial:
        # the first half's committed run from the cache point (committed slots, then accepted drafts) is
        # exactly what AR mode would cache: keep it
        cached = req.cache.block_cached
        first_end = span[-1] + (1 if p.mode == VerifyMode.FUSED else 0)
        kept = min(span[0] - cached + n_acc, first_end - cached)
        req.cache.block_cached += kept
    return kept


def _report_verification(req: Request, p: DraftStep, vq: VerifyQuery) -> None:
    """Trace the verified span's commits and record their AR-mode log-probabilities."""
    if req.logprobs is None and req.tracer.steps is None:
        return
    span, n_acc = p.span_slots, vq.n_accepted
    committed = span[: n_acc + (vq.correction is not None)]
    for i, s in enumerate(committed):
        tok = req.cursor.ids[s]
        _record(req, s, tok, _at(vq.logprobs or None, i), _at(vq.top or None, i), LogprobSource.AR)
    if req.tracer.steps is None:
        return
    how = "predraft" if req.tracer.steps and req.tracer.steps[-1].predrafted else "accepted"
    for i, s in enumerate(committed):
        tok = req.cursor.ids[s]
        if i < n_acc:
            conf = p.drafts.conf[p.span_offset + i]
            req.tracer.commit(req.cursor.start + s, tok, how, confidence=conf, q_prob=vq.q_probs[i])
        else:
            how = "resampled" if p.plan is None or p.plan.drafted else "ar"
            conf, q = vq.p_correction, vq.q_probs[i]
            req.tracer.commit(req.cursor.start + s, tok, how, confidence=conf, q_prob=q)


def _after_fused_verify(
    req: Request, p: DraftStep, group_drafts: list[SlotDrafts], n_acc: int, correction: int | None
) -> None:
    """Take the outcome's pre-draft group as the next step's drafts (or stale drafts on a miss)."""
    pre = pick_group(req, p, group_drafts, n_acc, correction)
    if pre is not None:
        req.predraft = (*pre, True)
        return
    req.stats.predraft_misses += 1
    if p.plan is not None and correction is None:
        _reuse_stale(req, p)
    elif req.config.reuse_stale and correction is not None and req.greedy:
        req.predraft = (*stale_drafts(req, p), False)


def _reuse_stale(req: Request, p: DraftStep) -> None:
    """A planned step that accepted all it verified: the next step verifies the drafts it left (the span's
    unverified rest; strict acceptance judges them, so the tokens stay AR greedy's) instead of drafting
    afresh; taken only if they cover the next step's candidates."""
    req.predraft = (*stale_drafts(req, p), False)
    req.stats.stale_reuses += 1


def finish_step(req: Request, p: DraftStep) -> None:
    """Top the step up to its quota with the baseline rule, feed the policy back, count the step."""
    chosen = fallback_picks(req, p)
    if chosen and req.grammar is not None:  # structured output: left to right, within the grammar
        chosen = conforming_picks(req, p, chosen)
    cur, v = req.cursor, p.drafts
    if chosen is not None:
        how = "baseline"
        if req.policy is not None:
            req.stats.fallback_commits += len(chosen)
            how = "fallback"
        tracing = req.tracer.steps is not None
        for i in chosen:
            s, tok = v.slots[i], v.drafts[i]
            cur.ids[s] = tok
            if tracing:
                req.tracer.commit(cur.start + s, tok, how, confidence=v.conf[i])
            if req.logprobs is not None:
                _record(req, s, tok, _at(v.logprob, i), _at(v.top, i), _draft_source(req, s))
        p.n_committed += len(chosen)
    if req.policy is not None and p.features is not None:
        req.policy.update(p.features, p.verified, p.n_committed, p.check)
    cur.step += 1

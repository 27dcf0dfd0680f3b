"""A step's commits into the open block: AR mode's first token, the verified span and the baseline
rule's top-up (:func:`finish_step`, every step's end), each traced and recorded with its log-probability.

:func:`verify_step` consumes a verification's outcome: it accepts the span (:func:`accept_span`; a lane
row's plain verification takes :func:`accept_plain`, the same writes for such a step), reports it, and
leaves the next step its pre-drafts (fused verification's group, or the stale drafts a planned step left).
"""

from __future__ import annotations

from ...decoding.policies import SkipCheck
from ..draft_step import DraftStep, SlotDrafts, VerifyMode
from ..logprobs import LogprobSource, TokenLogprob
from ..request import Request
from .device_math import VerifyQuery
from .fusion import pick_group, stale_drafts
from .grammar import conforming_picks
from .routing import fallback_picks


def record(req: Request, slot: int, token: int, logprob: float | None, top, source: LogprobSource) -> None:
    """Record the token committed at the open block's ``slot`` with its log-probability (if asked)."""
    if req.logprobs is not None and logprob is not None:
        req.logprobs[req.cursor.start + slot] = TokenLogprob(token, logprob, source, tuple(top or ()))


def at(values: list | None, i: int):
    """``values[i]``, or None without values."""
    return None if values is None else values[i]


def _draft_source(req: Request, slot: int) -> LogprobSource:
    """Block size 1 drafts are the AR mode's predictions, and so is a shifted model's slot 0."""
    if req.config.block_size == 1 or (req.info.shifted and slot == 0):
        return LogprobSource.AR
    return LogprobSource.DRAFT


def commit_first(req: Request, p: DraftStep, tok: int, logprob: float | None, top) -> None:
    """Commit AR mode's token ``tok`` at the step's first candidate; the span to verify starts after it."""
    cur, slot = req.cursor, p.candidates[0]
    cur.ids[slot] = tok
    p.done[0] = True
    p.n_committed = p.span_offset = 1
    req.tracer.commit(cur.start + slot, tok, "ar", confidence=p.drafts.conf[0])
    record(req, slot, tok, logprob, top, LogprobSource.AR)
    cur.n_committed += 1


def verify_step(req: Request, vq: VerifyQuery, group_drafts: list[SlotDrafts]) -> int:
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
    :func:`verify_step`)."""
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


def accept_plain(req: Request, p: DraftStep, n_acc: int, correction: int | None) -> int:
    """:func:`accept_span` of a plain verification (no plan, not fused) written out: the block and the
    counters only, for a step ``p`` that is done with (nothing reads its ``done`` or ``n_committed``
    after a step that needs no top-up). Returns the positions the row's cache keeps."""
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


def _report_verification(req: Request, p: DraftStep, vq: VerifyQuery) -> None:
    """Trace the verified span's commits and record their AR-mode log-probabilities."""
    if req.logprobs is None and req.tracer.steps is None:
        return
    span, n_acc = p.span_slots, vq.n_accepted
    committed = span[: n_acc + (vq.correction is not None)]
    for i, s in enumerate(committed):
        tok = req.cursor.ids[s]
        record(req, s, tok, at(vq.logprobs or None, i), at(vq.top or None, i), LogprobSource.AR)
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
                record(req, s, tok, at(v.logprob, i), at(v.top, i), _draft_source(req, s))
        p.n_committed += len(chosen)
    if req.policy is not None and p.features is not None:
        req.policy.update(p.features, p.verified, p.n_committed, p.check)
    cur.step += 1

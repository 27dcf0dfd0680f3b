"""The decode step: what a row does with the logits of its forward, and which forward it needs next.

One algorithm serves AR (block size 1), the static / dynamic / entropy-bounded baselines and S2D2; they
differ only in how a step chooses what to commit. A row's S2D2 step spans two engine steps when it
verifies (its draft forward, then its verification forward); its batch-mates do not wait for it.

Per row, :func:`advance` walks the block loop until the row needs a forward (``req.action``: prefill |
draft | verify | post) or is finished; :func:`postprocess` consumes that forward's logits: sample,
route, verify, accept, fall back, edit. Forward accounting: a finished block is committed to the cache
inside the next block's first draft forward, so commits cost no forward of their own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..decoding import functional as F
from ..decoding.policies import RouteFeatures, SkipCheck
from .fusion import pick_group, plan_groups, stale_logits
from .request import PendingVerify, Request, Status


# ---------------------------------------------------------------------------------------------- helpers
def _no_mask(req: Request, logits: torch.Tensor) -> torch.Tensor:
    """The mask token is never a prediction: committing it would leave the position masked forever."""
    logits = logits.clone()
    logits[:, req.info.mask_token_id] = float("-inf")
    return logits


def _probs(req: Request, logits: torch.Tensor) -> torch.Tensor:
    """``[c, vocab]`` distributions after the request's sampling transforms."""
    c = req.config
    return F.probs_from_logits(_no_mask(req, logits), c.temperature, c.top_k, c.top_p)


# ------------------------------------------------------------------------------------ the block loop
def _open_block(req: Request) -> None:
    cfg = req.config
    req.length = min(cfg.block_size, req.info.max_length - req.start)
    req.block = req.tokens[req.start : req.start + req.length].clone()
    full = cfg.last_block == "full"
    req.n_valid = req.length if full else min(req.length, req.limit - req.start)
    req.first_gen = max(0, req.n_prompt - req.start)
    req.cached = 0
    req.stats.blocks += 1
    req.unit_id, req.step, req.in_post, req.post_left = -1, 0, False, 0


def _close_block(req: Request) -> None:
    req.tokens[req.start : req.start + req.length] = req.block
    req.start += req.length
    req.block = None


def _finish(req: Request) -> None:
    cap = min(req.n_prompt + req.config.max_new_tokens, req.tokens.numel())
    if req.end is not None and req.end + 1 <= cap:
        out, reason = req.tokens[req.n_prompt : req.end + 1], "stop"
    else:
        out, reason = req.tokens[req.n_prompt : min(cap, req.limit)], "length"
    req.output_ids = out.tolist()
    req.stats.finish_reason = reason
    req.stats.generated_tokens = len(req.output_ids)
    if req.t_start is not None:
        req.stats.seconds = time.perf_counter() - req.t_start
    req.status, req.action = Status.FINISHED, None


def advance(req: Request) -> None:
    """Walk the block loop until the row needs a forward (sets ``req.action``) or is finished."""
    cfg, mask_id = req.config, req.info.mask_token_id
    while True:
        if req.state is not None and req.n_pre - req.state.length > req.fold_limit:
            req.action = "prefill"  # the rest (at most fold_limit positions) rides in the first draft
            return
        if req.pending is not None:
            req.action = "verify"
            return
        if req.block is None:
            if req.start >= req.limit or req.end is not None:
                _finish(req)
                return
            _open_block(req)
        if req.in_post:
            if req.post_left > 0:
                req.action = "post"
                return
            _close_block(req)
            continue
        blk = req.block.tolist()  # one host copy; the loop's bookkeeping is plain Python from here
        hi = req.n_valid
        stop = next((i for i in range(req.first_gen, hi) if blk[i] in req.stop_set), None)
        if stop is not None:
            hi = stop
            if mask_id not in blk[req.first_gen : stop]:
                req.end = req.start + stop
                _close_block(req)
                continue
        cand = [i for i in range(hi) if blk[i] == mask_id]
        if not cand:
            if cfg.editing_threshold is not None and cfg.post_steps > 0:
                req.in_post, req.post_left = True, cfg.post_steps  # edit-only passes, masks gone
                continue
            _close_block(req)
            continue
        u = cand[0] // req.unit
        if u != req.unit_id:
            req.unit_id, req.step = u, 0
        cand = [c for c in cand if c < (u + 1) * req.unit]
        req.cand, req.hi = torch.tensor(cand, dtype=torch.long), hi
        req.n_committed_block = len(blk) - blk.count(mask_id)
        pre, req.predraft = req.predraft, None
        if pre is not None and pre.start == req.start:
            req.stats.predraft_hits += int(pre.hit)
            _draft_step(req, pre.logits, predrafted=pre.hit)  # the fused verification drafted this step
            continue
        req.action = "draft"
        return


# ----------------------------------------------------------------------------------- after a forward
def draft_probs(rows: Sequence[Request], logits: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """The drafter's distributions ``[c, vocab]`` at each drafting row's candidates, batched.

    Rows with the same sampling transforms share one softmax over their concatenated candidates (rows
    are independent in it, so a row's values do not depend on its batch-mates). Rows that edit tokens
    first (LLaDA2.1) and rows that need no draft get None and compute their own.
    """
    out: list[torch.Tensor | None] = [None] * len(rows)
    groups: dict[tuple[float, int, float], list[int]] = {}
    for i, req in enumerate(rows):
        c = req.config
        if req.action == "draft" and c.editing_threshold is None:
            groups.setdefault((c.temperature, c.top_k, c.top_p), []).append(i)
    for (temperature, top_k, top_p), idx in groups.items():
        mask_id = rows[idx[0]].info.mask_token_id
        picked = torch.cat([logits[i].index_select(0, rows[i].cand) for i in idx])
        picked[:, mask_id] = float("-inf")
        probs = F.probs_from_logits(picked, temperature, top_k, top_p)
        for i, p in zip(idx, probs.split([rows[i].cand.numel() for i in idx]), strict=True):
            out[i] = p
    return out


def postprocess(req: Request, logits: torch.Tensor, probs: torch.Tensor | None = None) -> None:
    """Consume the logits of the row's forward (``req.action``), then :func:`advance`.

    ``probs`` may carry the draft distributions at ``req.cand`` computed in a batch (:func:`draft_probs`).
    """
    action = req.action
    if action == "prefill":
        req.stats.nfe_prefill += 1
    elif action == "draft":
        req.stats.nfe_draft += 1
        req.cached, req.cache_ext = req.cached + req.cache_ext, 0
        _draft_step(req, logits, probs)
    elif action == "post":
        req.stats.nfe_draft += 1
        req.tracer.begin_step(req.start, req.step)
        changed = _edit(req, logits, req.n_valid)
        req.post_left = req.post_left - 1 if changed else 0
    elif action == "verify":
        req.stats.nfe_verify += 1
        _verify_step(req, logits)
    else:  # pragma: no cover - the engine only runs rows with an action
        raise RuntimeError(f"request {req.request_id!r} has no pending forward")
    advance(req)


def _edit(req: Request, logits: torch.Tensor, hi: int) -> int:
    """LLaDA2.1-style token editing: replace generated tokens whose prediction changed confidently."""
    tau = req.config.editing_threshold
    block = req.block
    slots = (block[:hi] != req.info.mask_token_id).nonzero().view(-1)
    slots = slots[slots >= req.first_gen]
    if tau is None or slots.numel() == 0:
        return 0
    probs = _probs(req, logits[slots])
    new = F.sample(probs, req.greedy, req.generator)
    conf = F.token_probs(probs, new)
    change = (new != block[slots]) & (conf > tau)
    for s, t, c in zip(slots[change].tolist(), new[change].tolist(), conf[change], strict=True):
        block[s] = t
        req.tracer.commit(req.start + s, t, "edited", confidence=c)
    n = int(change.sum())
    req.stats.edits += n
    return n


def _draft_step(
    req: Request, logits: torch.Tensor, probs: torch.Tensor | None = None, *, predrafted: bool = False
) -> None:
    """Sample the drafts, commit a shifted model's slot 0, route; verify next or finish the step.

    ``predrafted``: the logits came from the previous fused verification's pre-draft group."""
    cfg, block, cand = req.config, req.block, req.cand
    req.stats.steps += 1
    req.tracer.begin_step(req.start, req.step, predrafted=predrafted)
    if cfg.editing_threshold is not None:
        _edit(req, logits, req.hi)
    if probs is None:
        probs = _probs(req, logits[cand])
    drafts = F.sample(probs, req.greedy, req.generator)
    conf = F.token_probs(probs, drafts)
    quota = 1 if req.rule == "eb" else F.quota(req.step, req.unit, cfg.num_steps)
    p = PendingVerify(cand, probs, drafts, conf, torch.zeros(cand.numel(), dtype=torch.bool), 0, 0, 0, quota)
    if req.info.shifted and int(cand[0]) == 0:
        # a shifted model predicts slot 0 from the previous position: that draft IS the AR token
        block[0] = drafts[0]
        p.done[0] = True
        p.n_committed = p.off = 1
        req.tracer.commit(req.start, int(drafts[0]), "ar", confidence=conf[0])
        req.n_committed_block += 1
    if req.policy is not None and p.off < cand.numel():
        span_cand = cand[p.off :]
        slots = span_cand.tolist()
        p.span_n = next((i for i in range(1, len(slots)) if slots[i] != slots[0] + i), len(slots))
        sp = slice(p.off, p.off + p.span_n)
        p.features = RouteFeatures(
            span_probs=probs[sp],
            span_drafts=drafts[sp],
            block_size=cfg.block_size,
            progress=req.n_committed_block / block.numel(),
            n_dynamic=int((conf[p.off :] > cfg.threshold).sum()),
            config=cfg,
        )
        if req.policy.decide(p.features):
            p.verified = True
            p.filled = block.clone()
            p.filled[cand] = drafts
            p.slots = slots[: p.span_n]
            if cfg.fuse:
                p.groups = plan_groups(req, p)
            req.pending = p
            return
    _finish_step(req, p)


def _verify_step(req: Request, q_logits: torch.Tensor) -> None:
    """Accept the verified span left to right against the AR-mode logits ``[span, vocab]``."""
    p, cfg, block = req.pending, req.config, req.block
    req.pending = None
    strict = cfg.strict
    group_rows: list[torch.Tensor] = []
    if p.groups is not None:
        sizes = [p.span_n] + [req.length - g.slot if g.slot is not None else g.rows for g in p.groups]
        q_logits, *group_rows = q_logits.split(sizes)
    q = _no_mask(req, q_logits) if strict else _probs(req, q_logits)
    sp = slice(p.off, p.off + p.span_n)
    checks = req.policy is not None and req.policy.learns_from_checks
    skip = _fallback_picks(req, p) if checks else None
    n_acc, correction = F.speculative_commit(
        p.probs[sp], q, p.drafts[sp], strict=strict, tempering=cfg.tempering, generator=req.generator
    )
    if checks:
        picks = skip if skip is not None else torch.zeros(0, dtype=torch.long)
        p.check = SkipCheck.of(picks, p.off, n_acc)
    span_cand = p.cand[p.off : p.off + p.span_n]
    block[span_cand[:n_acc]] = p.drafts[p.off : p.off + n_acc]
    p.done[p.off : p.off + n_acc] = True
    p.n_committed += n_acc
    if correction is not None:
        block[span_cand[n_acc]] = correction
        p.done[p.off + n_acc] = True
        p.n_committed += 1
    st = req.stats
    st.verify_steps += 1
    st.drafted += p.span_n
    st.accepted += n_acc
    st.full_accepts += int(n_acc == p.span_n)
    req.tracer.verified(p.span_n, n_acc)
    _trace_verification(req, p, q, n_acc, correction)
    if req.partial_cache:
        # the first half's committed run from the cache point (committed slots, then accepted drafts) is
        # exactly what AR mode would cache: keep it
        first_end = p.slots[-1] + (1 if p.groups is not None else 0)
        kept = min(p.slots[0] - req.cached + n_acc, first_end - req.cached)
        req.state.length += kept
        req.cached += kept
    if p.groups is not None:
        _after_fused_verify(req, p, group_rows, n_acc, correction)
    _finish_step(req, p)


def _trace_verification(
    req: Request, p: PendingVerify, q: torch.Tensor, n_acc: int, correction: int | None
) -> None:
    """Report the verified span's commits with the drafter's and the verifier's probabilities."""
    if req.tracer.steps is None:
        return
    qp = torch.softmax(q.float(), dim=-1) if req.config.strict else q
    how = "predraft" if req.tracer.steps and req.tracer.steps[-1].predrafted else "accepted"
    for i, s in enumerate(p.slots[:n_acc]):
        tok = int(req.block[s])
        req.tracer.commit(req.start + s, tok, how, confidence=p.conf[p.off + i], q_prob=qp[i, tok])
    if correction is not None:
        row = p.off + n_acc
        req.tracer.commit(
            req.start + p.slots[n_acc],
            correction,
            "resampled",
            confidence=p.probs[row, correction],
            q_prob=qp[n_acc, correction],
        )


def _after_fused_verify(
    req: Request, p: PendingVerify, group_rows: list[torch.Tensor], n_acc: int, correction: int | None
) -> None:
    """Take the outcome's pre-draft group as the next step's draft logits (or stale drafts on a miss)."""
    pre = pick_group(req, p, group_rows, n_acc, correction)
    if pre is None:
        req.stats.predraft_misses += 1
        if req.config.reuse_stale and correction is not None:
            pre = stale_logits(req, p)
    req.predraft = pre


def _finish_step(req: Request, p: PendingVerify) -> None:
    """Top the step up to its quota with the baseline rule, feed the policy back, count the step."""
    chosen = _fallback_picks(req, p)
    if chosen is not None:
        req.block[p.cand[chosen]] = p.drafts[chosen]
        p.n_committed += chosen.numel()
        how = "baseline"
        if req.policy is not None:
            req.stats.fallback_commits += chosen.numel()
            how = "fallback"
        if req.tracer.steps is not None:
            for i in chosen.tolist():
                tok, pos = int(p.drafts[i]), req.start + int(p.cand[i])
                req.tracer.commit(pos, tok, how, confidence=p.conf[i])
    if req.policy is not None and p.features is not None:
        req.policy.update(p.features, p.verified, p.n_committed, p.check)
    req.step += 1


def _fallback_picks(req: Request, p: PendingVerify) -> torch.Tensor | None:
    """Indices into ``p.cand`` the baseline rule commits if the step ends now: none once the step's
    commits reach its quota (None), else :func:`_top_up`'s."""
    return _top_up(req, p) if p.n_committed < p.quota else None


def _top_up(req: Request, p: PendingVerify) -> torch.Tensor | None:
    """Indices into ``p.cand`` the baseline rule commits to reach the quota (None: nothing to commit)."""
    n = p.cand.numel()
    if n == 1 and p.n_committed == 0:  # one candidate, nothing committed yet (AR, a block's last slot)
        return torch.zeros(1, dtype=torch.long)
    if bool(p.done.all()):
        return None
    rest = (~p.done).nonzero().view(-1)
    need = p.quota - p.n_committed
    if req.rule == "static":
        sel = F.select_static(p.conf[rest], need)
    elif req.rule == "dynamic":
        sel = F.select_dynamic(p.conf[rest], req.config.threshold, need)
    else:
        sel = F.select_entropy_bounded(F.entropy(p.probs[rest]), req.config.gamma, need)
    return rest[sel]

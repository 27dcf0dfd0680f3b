"""The block loop: a row's blocks opened, walked and closed until it needs a forward or is finished.

:func:`walk` is the loop itself; it runs a pre-drafted step through the ``take_predraft`` it is given
(the host's draft step, :func:`~.host.advance`), so this module depends on nothing of the step's after it.
The loop writes the row's cursor (:class:`~..block_cursor.BlockCursor`), its tokens as blocks close, its
end, its action and, once, its finished state.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..request import Action, Request, Status
from .grammar import forced_commits


def open_block(req: Request) -> None:
    """Open the block at the cursor's start: its slots, how many are valid, the first generated one."""
    cfg, cur = req.config, req.cursor
    cur.length = min(cfg.block_size, req.info.max_length - cur.start)
    cur.ids = req.tokens[cur.start : cur.start + cur.length]
    cur.n_valid = cur.length if cfg.last_block == "full" else min(cur.length, req.limit - cur.start)
    cur.first_generated = max(0, req.n_prompt - cur.start)
    req.cache.block_cached = 0
    req.stats.blocks += 1
    cur.unit_id, cur.step, cur.in_post, cur.post_left = -1, 0, False, 0


def close_block(req: Request) -> None:
    """Write the open block into the row's tokens and move the cursor past it."""
    cur = req.cursor
    req.tokens[cur.start : cur.start + cur.length] = cur.ids
    cur.start += cur.length
    cur.ids = None


def finish(req: Request) -> None:
    """The row's output (to its stop token, else to its limit), finish reason and time; finished."""
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


def walk(req: Request, take_predraft: Callable[[Request], bool]) -> None:
    """Walk the block loop until the row needs a forward (sets ``req.action``) or is finished.

    ``take_predraft(req)``: run the step on the drafts a fused verification left (True), or decline
    (False: the row drafts afresh)."""
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
        if req.predraft is not None and take_predraft(req):
            continue
        req.action = Action.DRAFT
        return

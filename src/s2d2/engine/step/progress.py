"""Every row ends: a row that makes no progress for :data:`NO_PROGRESS_FORWARDS` forwards fails alone.

A row progresses when a forward it ran commits a token, caches positions (prefill, recomputation after a
preemption) or spends one of its edit-only passes. A decoder commits at least one token per step, and
S2D2 verifies within a few draft forwards, so a healthy row never runs that many forwards in a row
without progress; one that does (a constraint whose dead end no look-ahead saw, a bug) would otherwise
run until its client gave up. With ``max_tokens`` it bounds every row's forwards: at most
``NO_PROGRESS_FORWARDS`` per generated token or cached prompt block, whatever the decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import RequestCannotEnd
from ..request import Request
from .row_queries import Fail

#: consecutive forwards without progress after which a row fails (documented in docs/ENGINE.md)
NO_PROGRESS_FORWARDS = 64


class NoProgress(RequestCannotEnd):
    """A row ran :data:`NO_PROGRESS_FORWARDS` forwards without committing anything."""


def progress_mark(req: Request) -> tuple[int, ...]:
    """What changes whenever the row progresses: its block's start and committed slots, its cached
    length and the edit-only passes it has left."""
    cur, state = req.cursor, req.cache.state
    mask = req.info.mask_token_id
    decided = 0 if cur.ids is None else sum(1 for t in cur.ids if t != mask)
    cached = -1 if state is None else state.length
    return cur.start, decided, cached, req.cache.block_cached, cur.post_left, int(cur.in_post)


def check_progress(rows: Sequence[Request], fail: Fail) -> None:
    """Count a forward each row ran (after its step; a row that ended is left alone); a row at the bound
    fails alone (``fail``) with :class:`NoProgress`."""
    for req in rows:
        if req.status.done:
            continue
        mark = progress_mark(req)
        if mark != req.progress_mark:
            req.progress_mark, req.stalled_forwards = mark, 0
            continue
        req.stalled_forwards += 1
        if req.stalled_forwards >= NO_PROGRESS_FORWARDS:
            generated = max(0, req.cursor.start - req.n_prompt)
            forwards = f"{NO_PROGRESS_FORWARDS} forwards (after {generated} generated positions)"
            fail(req, NoProgress(f"the request made no progress in {forwards}"))

"""The step after a forward that gave its rows' summaries (tensor-parallel ranks: no full-vocabulary
gather, :mod:`~s2d2.forward.vocab_summary`) instead of their logits.

:func:`from_summary` makes every row's queries (or lane place) over the summaries and checks that each
reads only what a summary holds (:func:`servable`): greedy tokens and their probabilities, margins,
entropies, the acceptance estimators. Where one does not (a sampled row, structured output, logit
adjustments, log-probabilities, a trace, kept distributions, fused verification's alternatives), or the
batched computation fails, it returns False having written nothing, and the caller runs the step on the
full logits of the same forward. Otherwise it does what :func:`~.postprocess.postprocess` does, on the
summaries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..request import Request
from ..row_forward import RowForward
from .device import DeviceOps
from .device_math import DraftQuery, VerifyQuery, run_queries
from .host import apply, recomputed
from .lanes import Lanes
from .row_queries import Fail, RowWork, each_alone, queries


def unfiltered(req: Request) -> bool:
    """A greedy request whose distributions no sampling filter changes (top-k, top-p, min-p off)."""
    c = req.config
    return req.greedy and c.top_k == 0 and c.top_p >= 1.0 and c.min_p == 0.0


def servable(q: DraftQuery | VerifyQuery) -> bool:
    """Whether ``q`` reads only what its rows' summaries hold."""
    req = q.req
    if req.config.logprobs is not None or q.positions is not None or q.grammar_bits is not None:
        return False
    if isinstance(q, VerifyQuery):
        return q.strict and req.tracer.steps is None
    return unfiltered(req) and not q.alternatives and not q.keep_probs


def from_summary(
    dev: DeviceOps,
    rows: list[Request],
    summaries: Sequence[torch.Tensor],
    parts: list[RowForward],
    fail: Fail,
    lanes: bool = True,
) -> bool:
    """The step over ``summaries`` (each row's, as :func:`~.postprocess.postprocess` takes its logits);
    False, with nothing written, where a row needs its full logits (see the module)."""
    lane = Lanes(summary=True)
    works: list[RowWork] = []
    again: list[tuple[Request, RowForward]] = []
    for req, lg, fwd in zip(rows, summaries, parts, strict=True):
        if req.cache.restore_to is not None and req.cache.recompute_left > 0:
            again.append((req, fwd))
            continue
        if lanes and lane.take(req, lg, fwd):
            if req.lane == "lossless" and not unfiltered(req):
                return False
            continue
        if req.grammar is not None:
            return False
        try:
            w = queries(dev, req, lg, fwd)
        except Exception:  # the full step fails the row with its own error
            return False
        if w.edit is not None and not servable(w.edit):
            return False
        if not all(map(servable, w.draft_queries + w.verify_queries)):
            return False
        works.append(w)
    edits = [w.edit for w in works if w.edit is not None]
    drafts = [q for w in works for q in w.draft_queries]
    verifies = [q for w in works for q in w.verify_queries]
    try:
        run_queries(dev, edits, drafts, verifies, lane.checks(dev), summary=True)
    except Exception:  # the full step finds the rows that cause it
        return False
    each_alone(again, recomputed, fail)
    lane.apply(fail)
    each_alone(((w.req, w) for w in works if not w.req.status.done), lambda _, w: apply(w), fail)
    return True

"""The step after the forward over the whole batch: every row's queries computed on the device at once (one
transfer), then each row's bookkeeping. A failing row fails alone; its batch-mates go on.

:func:`postprocess` is what :meth:`~s2d2.engine.llm_engine.LLMEngine.step` runs after the forward. It
writes row state through the step's own functions only (:func:`~.host.apply`, :func:`~.host.recomputed`,
the lanes' commits), once per row, and reports a row's failure through the engine's ``fail``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...forward.vocab_summary import Summarized
from ..request import Request
from ..row_forward import RowForward
from .device import DeviceOps
from .device_math import DraftQuery, VerifyQuery, run_queries
from .grammar import attach_masks
from .host import apply, recomputed
from .lanes import Lanes
from .row_queries import RowWork, queries
from .summary_step import from_summary

#: how the engine fails one row: ``fail(request, exception)`` (its status, action and one-line error)
Fail = Callable[[Request, BaseException], None]


def postprocess(
    dev: DeviceOps,
    rows: list[Request],
    logits: Sequence[torch.Tensor],
    parts: list[RowForward],
    fail: Fail,
    lanes: bool = True,
) -> None:
    """Every row's queries computed on the device at once (one transfer), then each row's bookkeeping;
    an error fails its request alone. ``logits``: the runner's, without zero rows (the general step's
    :func:`~.row_queries.queries` puts them back; the lanes read the raw rows). Rows rewriting a preempted
    cache only keep what they wrote. Common AR and lossless steps take their lanes (:mod:`.lanes`: batched
    queries, a lean commit each) unless ``lanes`` is off. ``logits`` that are the rows' summaries
    (:class:`~s2d2.forward.vocab_summary.Summarized`) serve the step where it reads no more
    (:mod:`.summary_step`); else it runs on the full logits of the same forward."""
    if isinstance(logits, Summarized):
        if from_summary(dev, rows, logits, parts, fail, lanes):
            return
        logits = logits.full()
    works: list[RowWork] = []
    edits: list[DraftQuery] = []
    drafts: list[DraftQuery] = []
    verifies: list[VerifyQuery] = []
    lane = Lanes()
    for req, lg, fwd in zip(rows, logits, parts, strict=True):
        try:
            if req.cache.restore_to is not None and req.cache.recompute_left > 0:
                recomputed(req, fwd)
                continue
            if lanes and lane.take(req, lg, fwd):
                continue
            w = queries(dev, req, lg, fwd)
            if req.grammar is not None:
                attach_masks(w)
        except Exception as exc:
            fail(req, exc)
            continue
        works.append(w)
        if w.edit is not None:
            edits.append(w.edit)
        if w.draft is not None:  # then the groups: the order of w.draft_queries and w.verify_queries
            drafts.append(w.draft)
        if w.groups:
            drafts += w.groups
        if w.verify is not None:
            verifies.append(w.verify)
        if w.lead is not None:
            verifies.append(w.lead)
    try:
        run_queries(dev, edits, drafts, verifies, lane.checks(dev))
    except Exception:  # a batched computation failed: find the rows that cause it (the lane's too)
        works += lane.as_rows(dev, fail)
        _run_queries_alone(dev, works, fail)
    lane.apply(fail)
    for w in works:
        if w.req.status.done:  # failed in the device half
            continue
        try:
            apply(w)
        except Exception as exc:  # one request's failure must not stop its batch-mates
            fail(w.req, exc)


def _run_queries_alone(dev: DeviceOps, works: list[RowWork], fail: Fail) -> None:
    for w in works:
        try:
            edits = [w.edit] if w.edit is not None else []
            run_queries(dev, edits, w.draft_queries, w.verify_queries)
        except Exception as row_exc:
            fail(w.req, row_exc)

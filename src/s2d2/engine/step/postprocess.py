"""The step after the forward over the whole batch, in one loop: every row's queries (or its lane's
place) made, computed on the device at once (one transfer), then each row's bookkeeping. A failing row
fails alone; its batch-mates go on.

:func:`after_forward` is what :meth:`~s2d2.engine.llm_engine.LLMEngine.step` runs after the forward. It
writes row state through the step's own functions only (:func:`~.host.apply`, :func:`~.host.recomputed`,
the lanes' commits), once per row, and reports a row's failure through the engine's ``fail``.

The loop reads the logits through one of two readers (:mod:`~s2d2.decoding.logits_readers`): the
forward's whole rows, or the rows' summaries a tensor-parallel forward gives where every row's traits
allow them (:attr:`~..request.RowTraits.summaries`, which the runner asked before the forward). Common AR and
lossless steps take their lanes (:class:`~.lanes.Lanes`: batched queries, a lean commit each).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...decoding.logits_readers import WHOLE_ROWS, Reader, Summaries
from ...forward.vocab_summary import Summarized
from ..request import Request
from ..row_forward import RowForward
from .device import DeviceOps
from .device_math import run_queries
from .grammar import attach_masks
from .host import apply, recomputed
from .lanes import Lanes
from .row_queries import Fail, RowWork, each_alone, queries


def after_forward(
    dev: DeviceOps,
    rows: list[Request],
    logits: Sequence[torch.Tensor],
    parts: list[RowForward],
    fail: Fail,
    lanes: bool = True,
) -> None:
    """Every row's step after the forward (see the module); an error fails its request alone.
    ``logits``: the runner's, without zero rows (:func:`~.row_queries.queries` puts them back; the lanes
    read the raw rows), or their summaries (:class:`~s2d2.forward.vocab_summary.Summarized`). Rows
    rewriting a preempted cache only keep what they wrote. ``lanes`` off: every row takes the general
    step."""
    if isinstance(logits, Summarized):
        if _step(dev, rows, logits, parts, fail, lanes, Summaries(rows[0].info.vocab_size)):
            return
        logits = logits.full()  # an error on the summaries: the whole rows find the row that causes it
    _step(dev, rows, logits, parts, fail, lanes, WHOLE_ROWS)


def _step(
    dev: DeviceOps,
    rows: list[Request],
    logits: Sequence[torch.Tensor],
    parts: list[RowForward],
    fail: Fail,
    lanes: bool,
    reader: Reader,
) -> bool:
    """The one loop, reading the rows through ``reader``. Nothing is written before the device half has
    run; reading summaries, any error returns False with nothing written (the caller then runs the step
    on the whole rows of the same forward, which fail the rows that cause it)."""
    lane = Lanes(reader)
    works: list[RowWork] = []
    again: list[tuple[Request, RowForward]] = []
    for req, lg, fwd in zip(rows, logits, parts, strict=True):
        try:
            if req.cache.restore_to is not None and req.cache.recompute_left > 0:
                again.append((req, fwd))
                continue
            if lanes and lane.take(req, lg, fwd):
                continue
            w = queries(dev, req, lg, fwd)
            if req.grammar is not None:
                attach_masks(w)
        except Exception as exc:
            if not reader.whole:
                return False
            fail(req, exc)
            continue
        works.append(w)
    edits = [w.edit for w in works if w.edit is not None]
    drafts = [q for w in works for q in w.draft_queries]
    verifies = [q for w in works for q in w.verify_queries]
    try:
        run_queries(dev, edits, drafts, verifies, lane.checks(dev), reader=reader)
    except Exception:  # a batched computation failed: find the rows that cause it (the lanes' too)
        if not reader.whole:
            return False
        works += lane.as_rows(dev, fail)
        each_alone(((w.req, w) for w in works), lambda _, w: _queries_alone(dev, w), fail)
    each_alone(again, recomputed, fail)
    lane.apply(fail)
    each_alone(((w.req, w) for w in works if not w.req.status.done), lambda _, w: apply(w), fail)
    return True


def _queries_alone(dev: DeviceOps, w: RowWork) -> None:
    """One row's queries computed alone (after the batch's failed)."""
    run_queries(dev, [w.edit] if w.edit is not None else [], w.draft_queries, w.verify_queries)

"""A failing shared forward fails the row(s) that caused it, not the whole batch.

One engine step runs every row's segment in ONE forward, so an exception there (an allocator failure
from one oversized row, a bad input that slipped through, an adapter bug one row's state triggers)
would otherwise fail every running request. :func:`run_isolating_failures` re-runs the forward on
halves of the batch (bisection) until each failure is pinned to single rows: those rows fail alone,
every other row gets the logits it would have had. That holds because a row's logits depend on its own
segment and cache only (docs/ENGINE.md, "Why batch == alone"), and because a forward advances nothing:
cached lengths grow only in the step, after the forward (docs/ARCHITECTURE.md, "Who writes what"), so a
failed forward leaves every row as it was and there is nothing to roll back (a row's keys/values past
its length are never read and are rewritten by the re-run; the native one-row path crops its cache back
to the row's length before it appends, :meth:`s2d2.families.hf.HFAdapter._native_forward`).

A failure that needs the whole batch (memory for all rows together, none of them too large alone)
disappears in the halves: then nothing fails and every row continues. Each re-run is a real forward and
is counted as one by the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from ...forward.vocab_summary import Summarized

Row = TypeVar("Row")
RunFn = Callable[[Sequence[Any], Sequence[Any]], list[torch.Tensor]]


def _run(run: RunFn, rows: Sequence[Any], segments: Sequence[Any]) -> list[torch.Tensor]:
    out = run(rows, segments)
    return out if isinstance(out, list) else list(out)


def _whole(run: RunFn, rows: Sequence[Any], segments: Sequence[Any]) -> list[torch.Tensor]:
    """A part's logits as full rows: the parts' rows are put together, so one part's summaries
    (:class:`~s2d2.forward.vocab_summary.Summarized`) become its full logits before the next forward."""
    out = _run(run, rows, segments)
    return out.full() if isinstance(out, Summarized) else out


def isolate(
    run: RunFn, rows: Sequence[Row], segments: Sequence[Any], *, whole_failed: bool = False
) -> tuple[list[torch.Tensor | None], dict[int, BaseException]]:
    """Run ``segments`` (one per row of ``rows``) through ``run`` (the runner's ``run``).

    Returns each row's logits (``None`` for a row that failed) and the failures by row index. The first
    try is the whole batch; only after it fails are halves re-run, recursively, down to single rows.
    ``whole_failed``: the caller has run the whole batch (two rows or more) and it failed: start with
    its halves.
    """
    logits: list[torch.Tensor | None] = [None] * len(rows)
    failures: dict[int, BaseException] = {}

    def attempt(index: list[int], known_failed: bool = False) -> None:
        if not known_failed:
            try:
                out = _whole(run, [rows[i] for i in index], [segments[i] for i in index])
            except Exception as exc:  # pinned down below, or charged to the one row it ran
                if len(index) == 1:
                    failures[index[0]] = exc
                    return
            else:
                for i, lg in zip(index, out, strict=True):
                    logits[i] = lg
                return
        half = len(index) // 2
        attempt(index[:half])
        attempt(index[half:])

    if rows:
        attempt(list(range(len(rows))), known_failed=whole_failed and len(rows) > 1)
    return logits, failures


def run_isolating_failures(
    run: RunFn,
    rows: Sequence[Row],
    segments: Sequence[Any],
    on_failure: Callable[[Row, BaseException], None],
) -> tuple[list[Row], list[torch.Tensor]]:
    """:func:`isolate`, then ``on_failure(row, exc)`` for each failed row; returns the rows that ran and
    their logits, in order (the engine step's drop-in for ``runner.run(rows, segments)``). A batch that
    runs (the usual case) costs one call, with no bookkeeping per row."""
    if not rows:
        return [], []
    try:
        return list(rows), _run(run, rows, segments)
    except Exception as exc:
        if len(rows) == 1:
            on_failure(rows[0], exc)
            return [], []
    logits, failures = isolate(run, rows, segments, whole_failed=True)
    for i, exc in failures.items():
        on_failure(rows[i], exc)
    kept = [i for i in range(len(rows)) if i not in failures]
    return [rows[i] for i in kept], [logits[i] for i in kept]  # type: ignore[misc]


__all__ = ["isolate", "run_isolating_failures"]

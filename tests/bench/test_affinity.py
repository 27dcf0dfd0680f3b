"""bench-batch --threads N pins the process to N CPUs while it measures, and gives them back."""

from __future__ import annotations

import os

import pytest

from s2d2.bench.affinity import pinned

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity")


@needs_affinity
def test_pinned_runs_on_the_last_cpus_and_restores_the_set():
    before = os.sched_getaffinity(0)
    with pinned(1) as cpus:
        assert cpus == [max(before)] and os.sched_getaffinity(0) == {max(before)}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError), pinned(1):  # restored after an error too
        raise RuntimeError("inside")
    assert os.sched_getaffinity(0) == before


@needs_affinity
def test_nothing_is_pinned_without_threads_or_with_more_threads_than_cpus():
    before = os.sched_getaffinity(0)
    for threads in (None, 0, len(before) + 1):
        with pinned(threads) as cpus:
            assert cpus is None and os.sched_getaffinity(0) == before

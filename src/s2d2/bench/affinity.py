"""Pinning a benchmark to CPUs: the process runs on ``threads`` fixed CPUs instead of wherever the
scheduler moves it.

On a small shared machine a single-threaded decode that the scheduler moves between cores measures
noisily: on this project's 2-core machine back-to-back cells of the same configuration spread over
about +-14% unpinned and +-2% pinned (BENCHMARKS.md, issue 50). Every cell of a run is pinned alike, so
a comparison between cells stays fair; figures from a pinned and an unpinned run are not comparable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def pinned(threads: int | None) -> Iterator[list[int] | None]:
    """Run the block pinned to ``threads`` of the CPUs this process may use (the last ones: the first
    CPU usually takes the machine's interrupts), and restore the CPUs it had after. Yields the CPUs
    pinned, or None (nothing pinned) for ``threads`` None, where the platform cannot pin (no
    ``sched_setaffinity``) or where fewer CPUs than ``threads`` are allowed."""
    if threads is None or threads < 1 or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < threads:
        yield None
        return
    chosen = allowed[-threads:]
    os.sched_setaffinity(0, chosen)
    try:
        yield chosen
    finally:
        os.sched_setaffinity(0, allowed)

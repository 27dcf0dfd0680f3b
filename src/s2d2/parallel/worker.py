"""The process of one tensor-parallel rank other than 0 (started by :mod:`.ranks`).

It joins the group, loads its shard of the checkpoint (only its slices), reports ready (or its load
error, one line) on its pipe, then runs the forwards rank 0 sends until rank 0 says stop
(:func:`~s2d2.parallel.rank_loop.serve_forwards`). It exits when rank 0's process is gone (checked twice
a second), so no rank outlives the driver, whatever ended it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

#: how often a rank checks that the driver's process is still alive (seconds)
PARENT_CHECK_S = 0.5
#: the store key of a rank's report (``REPORT_KEY/rank``), where it has no pipe (Ray)
REPORT_KEY = "s2d2/report"


class StoreReport:
    """A rank's report (``("ready", bytes)`` or ``("error", line)``) written to the group's store."""

    def __init__(self, store: Any, rank: int):
        self.store, self.key = store, f"{REPORT_KEY}/{rank}"

    def send(self, item: tuple[str, Any]) -> None:
        self.store.set(self.key, json.dumps(list(item)))


class StoreReader:
    """Rank 0's side of :class:`StoreReport`, read as a pipe's ``poll``/``recv``."""

    def __init__(self, store: Any, rank: int):
        self.store, self.key = store, f"{REPORT_KEY}/{rank}"

    def poll(self, timeout: float) -> bool:
        if self.store.check([self.key]):
            return True
        time.sleep(timeout)
        return bool(self.store.check([self.key]))

    def recv(self) -> tuple[str, Any]:
        kind, value = json.loads(self.store.get(self.key))
        return kind, value


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="s2d2-rank-parent-watch", daemon=True).start()


def rank_main(
    rank: int, size: int, host: str, port: int, path: str, device: str, dtype: str, options: dict[str, Any],
    timeout_s: float, threads: int, report: Any, parent: int | None = None,
) -> None:  # fmt: skip
    """The rank's whole life (the target of its process). Exit status 0 after rank 0's stop, 1 when
    the group failed (rank 0 gone or a rank hung) or the load failed."""
    _exit_with_parent(os.getppid() if parent is None else parent)
    import torch

    from ..families import load_adapter
    from ..forward.tensor_parallel import RankFailure, process_groups
    from .rank_loop import serve_forwards

    torch.set_num_threads(max(threads, 1))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tp = process_groups(rank, size, host, port, dev, timeout_s)  # failing, the rank exits: rank 0 sees it
    actor = report is None  # a Ray actor: the report goes through the group's store; it returns at the end
    if actor:
        report = StoreReport(tp.store, rank)
    try:
        adapter = load_adapter(path, device=dev, dtype=dtype, tp=tp, **options)
    except Exception as exc:  # the load's own error, one line, to rank 0 (which raises it)
        report.send(("error", f"rank {rank}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"))
        os._exit(1)
    report.send(("ready", sum(p.numel() * p.element_size() for p in adapter.model.parameters())))
    try:
        serve_forwards(adapter.fast, tp)
    except RankFailure:
        os._exit(1)
    if not actor:
        os._exit(0)

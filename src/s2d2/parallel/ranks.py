"""Starting and stopping the ranks of a tensor-parallel model (``tensor_parallel_size`` > 1).

The calling process is rank 0, the driver: it keeps the engine (scheduler, planner, the step's host
half) and runs its own shard's forward. Ranks 1..N-1 are processes of their own
(:func:`~.worker.rank_main`), started with ``torch.multiprocessing``'s spawn (backend ``mp``) or as Ray
actors (backend ``ray``, :mod:`.ray_ranks`). They meet at a TCP store rank 0 serves on ``127.0.0.1``
(``$S2D2_TP_HOST`` to name another address) and form the groups of
:func:`~s2d2.forward.tensor_parallel.process_groups`.

Lifecycle. :meth:`Ranks.close` (also run at the driver's exit) sends stop, waits a moment and kills any
rank still running. A rank exits by itself within half a second when the driver's process is gone
(killed by a signal included). A rank that dies or hangs fails the forward that needs it within the
group's timeout (``$S2D2_TP_TIMEOUT_S``, default 60 s): :class:`~s2d2.forward.tensor_parallel.RankFailure`.
Every rank process but the driver carries ``S2D2_TP_RANK`` (its rank) in its environment.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..families import detect_family
from ..families.checkpoint import read_config
from ..families.sharding import split_problem
from ..forward.tensor_parallel import DEFAULT_TIMEOUT_S, RANK_ENV, TensorParallel

BACKENDS = ("mp", "ray")
#: the store key each rank sets once it runs (``STARTED_KEY/rank``)
STARTED_KEY = "s2d2/started"
#: how often the driver checks that its ranks' processes live (seconds)
WATCH_S = 0.5
#: seconds the ranks get to load their shards
LOAD_TIMEOUT_S = 600.0


def timeout_s() -> float:
    try:
        return float(os.environ.get("S2D2_TP_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    except ValueError:
        raise ModelLoadError("S2D2_TP_TIMEOUT_S must be a number of seconds") from None


def check_parallel(path: Path, size: int, device: torch.device, backend: str) -> None:
    """A one-line :class:`ModelLoadError` when ``size`` ranks cannot run the model at ``path`` (before any
    process starts): it must divide the attention heads (and the other split sizes), and on CUDA not
    exceed the GPUs."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ModelLoadError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
    if backend not in BACKENDS:
        raise ModelLoadError(
            f"unknown distributed_executor_backend {backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    config = read_config(path)
    detect_family(config, path)  # an unknown family fails here, before any process starts
    problem = split_problem(config, size)
    if problem is not None:
        raise ModelLoadError(f"{path.name}: {problem}")
    if device.type == "cuda" and backend == "mp" and size > torch.cuda.device_count():
        raise ModelLoadError(
            f"tensor_parallel_size {size} exceeds the {torch.cuda.device_count()} GPU(s) of this machine"
        )


@dataclass
class Ranks:
    """The driver's handle on ranks 1..N-1: their processes (or actors) and the group."""

    tp: TensorParallel
    processes: list[Any] = field(default_factory=list)
    #: each rank's parameter bytes, rank 0 first (filled once the ranks are ready)
    param_bytes: list[int] = field(default_factory=list)
    closed: bool = False
    #: run last by :meth:`close` (the Ray backend removes its placement group)
    on_close: Any = None

    def alive(self) -> list[bool]:
        return [p.is_alive() for p in self.processes]

    def watch(self) -> None:
        """Break the group as soon as a rank's process exits (checked every :data:`WATCH_S` seconds), so
        an idle driver knows before its next forward (a forward under way fails by itself: the dead
        rank's connections close)."""

        def run() -> None:
            while not self.closed:
                for rank, p in enumerate(self.processes, start=1):
                    if not p.is_alive() and not self.closed and self.tp.broken is None:
                        self.tp.broken = f"tensor-parallel rank {rank} exited (status {p.exitcode})"
                time.sleep(WATCH_S)

        threading.Thread(target=run, name="s2d2-rank-watch", daemon=True).start()

    def close(self, wait_s: float = 5.0) -> None:
        """Stop every rank: a stop message (when the group works), then kill what still runs after
        ``wait_s`` seconds. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.tp.broken is None:
            try:
                with self.tp.lock:
                    self.tp.send(("stop",))
            except Exception:  # a rank already gone: killed below
                pass
        deadline = time.monotonic() + wait_s
        for p in self.processes:
            p.join(max(deadline - time.monotonic(), 0.0))
        for p in self.processes:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        if self.on_close is not None:
            self.on_close()


def start_mp(
    path: Path, size: int, *, device: torch.device, dtype: str | None, options: dict[str, Any]
) -> Ranks:
    """Rank 0 here, ranks 1..N-1 spawned (``torch.multiprocessing``), all joined in one group; rank 0's
    own shard is loaded by the caller with ``tp`` (:attr:`Ranks.tp`)."""
    from multiprocessing import resource_tracker

    import torch.distributed as dist
    import torch.multiprocessing as mp

    from ..forward.tensor_parallel import process_groups
    from .worker import rank_main

    host = os.environ.get("S2D2_TP_HOST", "127.0.0.1")
    limit = timeout_s()
    store = dist.TCPStore(host, 0, size, True, timeout=_seconds(max(limit, 120.0)), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    threads = max(torch.get_num_threads() // size, 1)
    if device.type == "cpu":  # the ranks share this process's cores: 1/N of its threads each, rank 0's too
        torch.set_num_threads(threads)
    procs, pipes = [], []
    resource_tracker.ensure_running()  # started now, so that it does not carry a rank's marker
    for rank in range(1, size):
        ours, theirs = ctx.Pipe(duplex=False)
        dev = f"cuda:{rank}" if device.type == "cuda" else str(device)
        args = (rank, size, host, store.port, str(path), dev, dtype or "auto", options, limit, threads,
                theirs, os.getpid())  # fmt: skip
        p = ctx.Process(target=rank_main, args=args, daemon=True, name=f"s2d2-rank-{rank}")
        os.environ[RANK_ENV] = str(rank)  # the child's environment marks it
        try:
            p.start()
        finally:
            os.environ.pop(RANK_ENV, None)
        procs.append(p)
        pipes.append(ours)
    _wait_started(store, procs)
    tp = process_groups(0, size, host, store.port, device, limit, store=store)
    ranks = Ranks(tp, procs)
    ranks.pipes = pipes
    atexit.register(ranks.close)
    return ranks


def _wait_started(store: Any, procs: list[Any]) -> None:
    """Wait until every rank has reached the store (:data:`STARTED_KEY`), or fail at once when one exits
    first (its error is on its stderr: a script that loads a model at import, without
    ``if __name__ == "__main__":``, is the usual one with spawned processes)."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    for rank, p in enumerate(procs, start=1):
        while not store.check([f"{STARTED_KEY}/{rank}"]):
            if not p.is_alive() or time.monotonic() > deadline:
                for q in procs:
                    q.kill()
                raise ModelLoadError(
                    f"tensor-parallel rank {rank} exited before it started (see its error above; a script "
                    "that loads a model must guard it with if __name__ == '__main__':)"
                )
            time.sleep(0.05)


def wait_ready(ranks: Ranks, own_bytes: int) -> None:
    """Wait for every rank's load (its parameter bytes) or its one-line error (then close the ranks and
    raise it)."""
    sizes = [own_bytes]
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    for rank, (p, pipe) in enumerate(zip(ranks.processes, ranks.pipes, strict=True), start=1):
        while not pipe.poll(0.2):
            if not p.is_alive() or time.monotonic() > deadline:
                ranks.close(0.0)
                raise ModelLoadError(f"tensor-parallel rank {rank} exited before its shard loaded")
        kind, value = pipe.recv()
        if kind == "error":
            ranks.close(0.0)
            raise ModelLoadError(value)
        sizes.append(int(value))
    ranks.param_bytes = sizes


def _seconds(s: float):
    from datetime import timedelta

    return timedelta(seconds=s)

"""Ranks 1..N-1 as Ray actors (``distributed_executor_backend="ray"``), in one placement group.

Each actor runs :func:`~.worker.rank_main` (its report goes through the group's TCP store); rank 0 stays
in the calling process (a driver, or a replica of ``s2d2 serve --ray``: R replicas of N ranks each).
The placement group packs the ranks (``PACK``: one bundle of one CPU, and one GPU on CUDA, a rank); on a
multi-node cluster they may sit on other nodes, which reach rank 0's store at this node's address
(``$S2D2_TP_HOST`` names another). Ray is the optional extra ``ray``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..forward.tensor_parallel import RANK_ENV, process_groups
from .ranks import Ranks, timeout_s
from .worker import StoreReader, rank_main


class RayRank:
    """A rank's actor and its running ``run`` call, seen as a process (``is_alive``, ``join``, ``kill``)."""

    def __init__(self, actor: Any, ref: Any):
        self.actor, self.ref = actor, ref
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        import ray

        done, _ = ray.wait([self.ref], timeout=0)
        return not done

    def join(self, timeout: float | None = None) -> None:
        import ray

        ray.wait([self.ref], timeout=timeout)

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)


def _actor_class() -> Any:
    import ray

    @ray.remote
    class S2D2Rank:
        def run(self, *args: Any) -> None:
            os.environ[RANK_ENV] = str(args[0])
            rank_main(*args)

    return S2D2Rank


def start_ray(
    path: Path, size: int, *, device: torch.device, dtype: str | None, options: dict[str, Any]
) -> Ranks:
    """Rank 0 here, ranks 1..N-1 as Ray actors in a placement group (Ray started here unless it runs)."""
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError:
        raise ModelLoadError(
            "distributed_executor_backend 'ray' needs Ray: pip install 's2d2[ray]'"
        ) from None
    import torch.distributed as dist

    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    host = os.environ.get("S2D2_TP_HOST") or ray.util.get_node_ip_address()
    limit = timeout_s()
    store = dist.TCPStore(host, 0, size, True, wait_for_workers=False)
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if device.type == "cuda" else {})}
    group = placement_group([dict(bundle) for _ in range(1, size)], strategy="PACK")
    if not group.wait(timeout_seconds=120):
        remove_placement_group(group)
        raise ModelLoadError(f"Ray could not place {size - 1} tensor-parallel rank(s) ({bundle} each)")
    cls, ranks_ = _actor_class(), []
    for rank in range(1, size):
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=rank - 1
        )
        actor = cls.options(scheduling_strategy=strategy, num_cpus=bundle["CPU"],
                            num_gpus=bundle.get("GPU", 0)).remote()  # fmt: skip
        dev = "cuda:0" if device.type == "cuda" else str(device)  # the actor sees its own GPU only
        args = (rank, size, host, store.port, str(path), dev, dtype or "auto", options, limit, 1, None)
        ranks_.append(RayRank(actor, actor.run.remote(*args)))
    deadline = time.monotonic() + 300
    for rank in range(1, size):
        while not store.check([f"s2d2/started/{rank}"]):
            if not ranks_[rank - 1].is_alive() or time.monotonic() > deadline:
                for r in ranks_:
                    r.kill()
                remove_placement_group(group)
                raise ModelLoadError(f"tensor-parallel rank {rank} (a Ray actor) exited before it started")
            time.sleep(0.05)
    tp = process_groups(0, size, host, store.port, device, limit, store=store)
    ranks = Ranks(tp, ranks_)
    ranks.pipes = [StoreReader(store, rank) for rank in range(1, size)]
    ranks.on_close = lambda: remove_placement_group(group)
    import atexit

    atexit.register(ranks.close)
    return ranks

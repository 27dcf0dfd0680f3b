"""Models over several processes: tensor and expert parallelism (``tensor_parallel_size`` > 1).

:func:`load_parallel` starts the ranks (:mod:`.ranks`; each runs :mod:`.rank_loop`), loads rank 0's
shard here and returns its adapter: the engine drives it as it drives a model of one process; each
forward is sent to the other ranks (:mod:`s2d2.forward.tensor_parallel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..families import load_adapter
from ..families.base import ModelAdapter
from ..families.checkpoint import resolve_device
from .ranks import BACKENDS, Ranks, check_parallel, start_mp, wait_ready


def load_parallel(
    path: Path, size: int, *, device: Any = None, dtype: Any = None, backend: str = "mp", **options: Any
) -> ModelAdapter:
    """The adapter of rank 0 of ``size`` ranks of the checkpoint ``path`` (each rank loads its slices);
    ``adapter.ranks`` is the :class:`~.ranks.Ranks` handle (``close()``, per-rank ``param_bytes``).
    A bad size or backend is a one-line :class:`~s2d2.errors.ModelLoadError` before any process starts.
    With ``size`` 1 (and a known backend) it is :func:`~s2d2.families.load_adapter`: this process alone."""
    if size == 1 and backend in BACKENDS:
        return load_adapter(path, device=device, dtype=dtype, **options)
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    check_parallel(path, size, dev, backend)
    if backend == "ray":
        from .ray_ranks import start_ray

        ranks = start_ray(path, size, device=dev, dtype=dtype, options=options)
    else:
        ranks = start_mp(path, size, device=dev, dtype=dtype, options=options)
    try:
        adapter = load_adapter(path, device=dev, dtype=dtype, tp=ranks.tp, **options)
        wait_ready(ranks, sum(p.numel() * p.element_size() for p in adapter.model.parameters()))
    except BaseException:
        ranks.close(0.0)
        raise
    adapter.ranks = ranks
    ranks.watch()
    return adapter


__all__ = ["BACKENDS", "Ranks", "check_parallel", "load_parallel"]

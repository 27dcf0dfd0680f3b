"""The resumable training checkpoint ``ckpt.pt``: what it holds, written atomically, and read back.

It holds the model and optimiser states, the run's progress ``state`` (step, elapsed time, stream index,
evaluations), the NumPy, Python and torch RNG states, the run's options (so a resumed run keeps them, see
:meth:`~s2d2.training.options.RunOptions.resumed`), the weight average and the model config. A killed run
resumes from it: the file is replaced whole or not at all.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from s2d2.training.ema import WeightEMA
from s2d2.training.options import RunOptions

__all__ = ["restore_checkpoint", "save_checkpoint"]


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    state: dict,
    rng: np.random.Generator,
    opts: RunOptions,
    averager: WeightEMA | None,
    config: Any,
) -> None:
    """Write the run's checkpoint to ``path`` (atomically: a temporary file, then a rename)."""
    _atomic_save(
        {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "state": state,
            "np_rng": rng.bit_generator.state,
            "py_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
            "total_s": opts.total_s,
            "steps": opts.steps,
            "block_mix": opts.block_mix,
            "ar_first": opts.ar_first,
            "lr": opts.lr,
            "ema_decay": averager.decay if averager is not None else 0.0,
            "hard_focus": opts.hard_focus,
            "ema": averager.state_dict() if averager is not None else None,
            "config": config,
        },
        path,
    )


def restore_checkpoint(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator
) -> dict:
    """Load ``path`` into the model, the optimiser and the RNG streams (NumPy's ``rng``, Python's, torch's);
    return the whole checkpoint (its ``state``, options and weight average are the caller's to take)."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    rng.bit_generator.state = ck["np_rng"]
    random.setstate(ck["py_rng"])
    torch.set_rng_state(ck["torch_rng"])
    return ck

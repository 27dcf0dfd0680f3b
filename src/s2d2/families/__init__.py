"""The model families and their loading: one module per family, chosen from ``config.json`` without
running remote code. Each family's adapter runs its forward on the family-independent machinery in
:mod:`s2d2.forward` (the batch description, paged KV, attention, graphs).

A family module provides ``SPEC``, its :class:`~.loader.FamilySpec` (what names it in ``config.json``, its
native class and config, its weights, its rules); :func:`~.loader.load` loads every family. Add a family
by writing one module and listing it in :data:`FAMILIES`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import ModelLoadError
from . import fast_dllm_v2, llada2, sdar, sdar_moe
from .base import KVState, ModelAdapter, ModelInfo
from .checkpoint import resolve_device, resolve_dtype
from .checkpoint_facts import resolve_facts
from .loader import load
from .side_files import read_side_files

FAMILIES: list[ModuleType] = [sdar, sdar_moe, fast_dllm_v2, llada2]


def detect_family(config: dict[str, Any], path: Path | str = "model") -> ModuleType:
    """The family module whose ``detect`` accepts ``config``, or a one-line :class:`ModelLoadError`."""
    for fam in FAMILIES:
        if fam.SPEC.detect(config):
            return fam
    model_type = config.get("model_type")
    names = ", ".join(f.FAMILY for f in FAMILIES)
    if config.get("auto_map"):
        raise ModelLoadError(
            f"{path}: unsupported model_type {model_type!r}: its config.json names only remote code "
            f"(auto_map), which s2d2 never runs; supported families: {names}"
        )
    raise ModelLoadError(f"{path}: unsupported model_type {model_type!r}; supported families: {names}")


def load_adapter(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    block_size: int | None = None,
    name: str | None = None,
    generation_config: str | None = "auto",
    **options: Any,
) -> ModelAdapter:
    """Load the adapter of the checkpoint directory ``path``; ``options`` go to the family's loader.

    Its stop ids, block size, mask id and sampling defaults are resolved from the side files by
    :mod:`.checkpoint_facts` (``block_size``: the option; ``name``: the repo id whose ``-bN`` suffix may give
    it; ``generation_config``: ``auto``, ``vllm``/``off`` or a folder)."""
    path = Path(path).expanduser()
    side = read_side_files(path)
    fam = detect_family(side.config, path)
    dev = resolve_device(device)
    facts = resolve_facts(
        side, fam.SPEC.rules, block_size_option=block_size, name=name, generation_config=generation_config
    )
    return load(fam.SPEC, path, side.config, facts, device=dev, dtype=resolve_dtype(dtype, dev), **options)


__all__ = ["FAMILIES", "KVState", "ModelAdapter", "ModelInfo", "detect_family", "load_adapter"]

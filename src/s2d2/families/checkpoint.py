r"""Reading a checkpoint directory: ``config.json``, safetensors weights (never pickles), the device and
dtype to load on, and whether a config names a family. Errors are one-line
:class:`~s2d2.errors.ModelLoadError`\ s."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError


def read_config(path: Path) -> dict[str, Any]:
    """Read ``config.json`` of a model directory with clear errors."""
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"model path is not a directory: {path}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"no config.json in {path}: not a model directory")
    try:
        return json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({exc.__class__.__name__}: {exc})") from None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files holding the weights of a directory: a sharded index's shards, else
    ``model.safetensors``, else every ``model*.safetensors``; a :class:`ModelLoadError` when there are none,
    the index is broken or a shard it names is missing."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index ({exc})") from None
        files = [path / s for s in shards]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        files = sorted(path.glob("model*.safetensors"))
    if not files:
        pickled = list(path.glob("*.bin"))
        hint = " (only pickled .bin weights found; convert them to safetensors)" if pickled else ""
        raise ModelLoadError(f"no safetensors weights in {path}{hint}")
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"missing weight shard {f.name} in {path}")
    return files


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load all weights of a directory (:func:`weight_files`). Never unpickles."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights {f}: {str(exc).splitlines()[0]}") from None
    return weights


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``/None -> float32 on CPU, bfloat16 on CUDA; else bf16/fp16/fp32 (or a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose bf16, fp16 or fp32")
    return table[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto``/None -> ``$S2D2_DEVICE`` when set, else cuda if available, else cpu."""
    if device in (None, "auto"):
        device = os.environ.get("S2D2_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' requested but no CUDA GPU is available")
    return dev


def load_weights_into(model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Strictly load ``weights`` into ``model`` with a one-line error for missing/unexpected/misshapen."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} (e.g. {unexpected[0]})")
        raise ModelLoadError(f"weights in {path} do not match the config: {'; '.join(parts)}")
    for k, v in weights.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ModelLoadError(
                f"weights in {path} do not match the config: {k} has shape {tuple(v.shape)}, "
                f"expected {tuple(own[k].shape)}"
            )
    model.load_state_dict(weights, strict=True)


def matches_family(
    config: dict[str, Any],
    model_types: tuple[str, ...],
    architectures: tuple[str, ...],
    auto_map_names: tuple[str, ...] = (),
) -> bool:
    """Whether ``config`` names this family by model_type, architectures or (lower-cased) auto_map names."""
    if str(config.get("model_type", "")).lower() in model_types:
        return True
    if any(a in architectures for a in config.get("architectures") or []):
        return True
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict) and auto_map_names:
        return any(n in str(v).lower() for v in auto_map.values() for n in auto_map_names)
    return False

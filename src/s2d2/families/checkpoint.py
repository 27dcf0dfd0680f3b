r"""Reading a checkpoint directory: ``config.json``, the tokenizer (and its added tokens), safetensors
weights (never pickles), the device and dtype to load on, and the config facts every family checks (does
it name this family, which token is the mask). Errors are one-line :class:`~s2d2.errors.ModelLoadError`\ s."""

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


def read_added_tokens(path: Path) -> dict[str, int]:
    """Token ids from ``added_tokens.json`` and ``tokenizer.json``'s added tokens, if present."""
    found: dict[str, int] = {}
    tok_file = path / "tokenizer.json"
    if tok_file.is_file():
        try:
            for tok in json.loads(tok_file.read_text()).get("added_tokens", []):
                found[tok["content"]] = int(tok["id"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
    added = path / "added_tokens.json"
    if added.is_file():
        try:
            found.update({k: int(v) for k, v in json.loads(added.read_text()).items()})
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{added} is not a valid token map ({exc})") from None
    return found


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load all weights of a directory from ``model.safetensors`` or a sharded index. Never unpickles."""
    from safetensors.torch import load_file

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
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"missing weight shard {f.name} in {path}")
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


def find_mask_token(config: dict[str, Any], added: dict[str, int], names: tuple[str, ...]) -> int | None:
    """``mask_token_id`` from config.json, else the first of ``names`` among the tokenizer's added tokens."""
    if config.get("mask_token_id") is not None:
        return int(config["mask_token_id"])
    return next((added[n] for n in names if n in added), None)


def require_mask_token(
    path: Path, config: dict[str, Any], added: dict[str, int], names: tuple[str, ...], vocab_size: int
) -> int:
    """The mask token id, or a one-line :class:`ModelLoadError` (missing, or outside the vocabulary)."""
    mask_id = find_mask_token(config, added, names)
    if mask_id is None:
        raise ModelLoadError(
            f"{path}: no mask token: config.json has no mask_token_id and neither added_tokens.json nor "
            f"tokenizer.json defines {names[0]!r}"
        )
    if not 0 <= mask_id < vocab_size:
        raise ModelLoadError(f"mask token id {mask_id} is outside the vocabulary (size {vocab_size})")
    return mask_id


def load_tokenizer(path: Path) -> Any | None:
    """The directory's tokenizer through transformers (never remote code), or None if it has none."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    import warnings

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # AutoTokenizer reads config.json and warns about the unknown model_type
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # tokenizers raise many types; the user needs one line
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)

"""SDAR family (SDAR, TraDo and their kin): same-position predictions on a Qwen3 backbone.

The checkpoint's ``config.json`` says ``model_type: sdar`` and points at remote code; we never run that
code. Its weights use Qwen3's names, so the model is transformers' native ``Qwen3ForCausalLM`` driven
with 4-D masks (see :mod:`s2d2.adapters.hf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from .base import ModelInfo, load_safetensors
from .hf import HFAdapter

FAMILY = "sdar"
MODEL_TYPES = ("sdar", "trado")
ARCHITECTURES = ("SDARForCausalLM", "TraDoForCausalLM")

_QWEN3_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def detect(config: dict[str, Any]) -> bool:
    if str(config.get("model_type", "")).lower() in MODEL_TYPES:
        return True
    return any(a in ARCHITECTURES for a in config.get("architectures") or [])


def mask_token_id(config: dict[str, Any], added: dict[str, int]) -> int | None:
    if config.get("mask_token_id") is not None:
        return int(config["mask_token_id"])
    for name in ("<|MASK|>", "<|mask|>", "<mask>", "|<MASK>|"):
        if name in added:
            return added[name]
    return None


def eos_ids(config: dict[str, Any]) -> list[int]:
    eos = config.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


def qwen3_config(config: dict[str, Any]) -> Any:
    from transformers import Qwen3Config

    kwargs = {k: config[k] for k in _QWEN3_KEYS if config.get(k) is not None}
    if "head_dim" not in kwargs:
        kwargs["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling") or {}
    rope_params = {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": theta}
    rope_params.update({k: v for k, v in scaling.items() if k not in ("type", "rope_type")})
    return Qwen3Config(
        **kwargs,
        rope_parameters=rope_params,
        use_sliding_window=False,  # no family here uses a sliding window
        sliding_window=None,
        layer_types=["full_attention"] * int(config["num_hidden_layers"]),
    )


def load(
    path: Path,
    config: dict[str, Any],
    added: dict[str, int],
    *,
    device: torch.device,
    dtype: torch.dtype,
    **options: Any,
) -> HFAdapter:
    from transformers import Qwen3ForCausalLM

    if options:
        raise ModelLoadError(f"unknown option(s) for the {FAMILY} family: {', '.join(sorted(options))}")
    mask_id = mask_token_id(config, added)
    if mask_id is None:
        raise ModelLoadError(f"{path}/config.json has no mask_token_id (and no mask token in the tokenizer)")
    try:
        qcfg = qwen3_config(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{path}/config.json is not a valid SDAR config ({exc.__class__.__name__}: {exc})"
        ) from None
    if not 0 <= mask_id < qcfg.vocab_size:
        raise ModelLoadError(f"mask_token_id {mask_id} is outside the vocabulary (size {qcfg.vocab_size})")
    weights = load_safetensors(path)
    model = HFAdapter.build_native(Qwen3ForCausalLM, qcfg, weights, path, device, dtype)
    info = ModelInfo(
        family=FAMILY,
        mask_token_id=mask_id,
        eos_token_ids=eos_ids(config),
        vocab_size=qcfg.vocab_size,
        max_length=int(config.get("max_position_embeddings", 32768)),
        default_block_size=config.get("block_size"),
        shifted=False,
        pad_token_id=config.get("pad_token_id"),
        bos_token_id=config.get("bos_token_id"),
    )
    return HFAdapter(model, info, path)

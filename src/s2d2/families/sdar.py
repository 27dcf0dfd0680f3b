"""SDAR family (SDAR, TraDo and their kin): same-position predictions on a Qwen3 backbone.

The checkpoint's ``config.json`` says ``model_type: sdar`` and points at remote code; we never run that
code. Its weights use Qwen3's names, so the model is transformers' native ``Qwen3ForCausalLM`` driven
with 4-D masks (see :mod:`s2d2.families.hf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from .base import ModelInfo
from .checkpoint import find_mask_token, matches_family, require_mask_token
from .hf import HFAdapter
from .sharding import dense_checkpoint

FAMILY = "sdar"
MODEL_TYPES = ("sdar", "trado")
ARCHITECTURES = ("SDARForCausalLM", "TraDoForCausalLM")
MASK_TOKENS = ("<|MASK|>", "<|mask|>", "<mask>", "|<MASK>|")

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
    return matches_family(config, MODEL_TYPES, ARCHITECTURES)


def mask_token_id(config: dict[str, Any], added: dict[str, int]) -> int | None:
    return find_mask_token(config, added, MASK_TOKENS)


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
    tp: Any = None,
    **options: Any,
) -> HFAdapter:
    from transformers import Qwen3ForCausalLM

    if options:
        raise ModelLoadError(f"unknown option(s) for the {FAMILY} family: {', '.join(sorted(options))}")
    try:
        qcfg = qwen3_config(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{path}/config.json is not a valid SDAR config ({exc.__class__.__name__}: {exc})"
        ) from None
    mask_id = require_mask_token(path, config, added, MASK_TOKENS, qcfg.vocab_size)
    weights, native = dense_checkpoint(path, qcfg, tp)  # this rank's slices only, under tensor parallel
    model = HFAdapter.build_native(Qwen3ForCausalLM, native, weights, path, device, dtype)
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
    return HFAdapter(model, info, path, tp=tp)

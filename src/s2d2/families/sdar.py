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
from .checkpoint import matches_family
from .checkpoint_facts import CheckpointFacts, FamilyRules, model_info
from .hf import HFAdapter
from .sharding import dense_checkpoint
from .tensor_names import mlp, qwen_names

FAMILY = "sdar"
MODEL_TYPES = ("sdar", "trado")
ARCHITECTURES = ("SDARForCausalLM", "TraDoForCausalLM")
MASK_TOKENS = ("<|MASK|>", "<|mask|>", "<mask>", "|<MASK>|")
#: SDAR's published checkpoints are run with blocks of 4 (their ``-bN`` variants say otherwise by name).
RULES = FamilyRules(mask_tokens=MASK_TOKENS, published_block_size=4)

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


def tensor_names(config: dict[str, Any]) -> list[str]:
    """The checkpoint tensors this family reads (Qwen3's names)."""
    bias = bool(config.get("attention_bias"))
    return qwen_names(config, qk_norm=True, qkv_bias=bias, o_bias=bias, mlp_of=lambda i, p: mlp(p))


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
    facts: CheckpointFacts,
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
    mask_id = facts.require_mask(path, qcfg.vocab_size)
    weights, native = dense_checkpoint(path, qcfg, tp)  # this rank's slices only, under tensor parallel
    model = HFAdapter.build_native(Qwen3ForCausalLM, native, weights, path, device, dtype)
    info = model_info(FAMILY, facts, config, mask_token_id=mask_id, vocab_size=qcfg.vocab_size)
    return HFAdapter(model, info, path, tp=tp)

"""SDAR family (SDAR, TraDo and their kin): same-position predictions on a Qwen3 backbone.

The checkpoint's ``config.json`` says ``model_type: sdar`` and points at remote code; we never run that
code. Its weights use Qwen3's names, so the model is transformers' native ``Qwen3ForCausalLM`` driven
with 4-D masks (see :mod:`s2d2.families.hf`).
"""

from __future__ import annotations

from typing import Any

from .checkpoint_facts import FamilyRules
from .loader import FamilySpec
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


SPEC = FamilySpec(
    name=FAMILY,
    title="SDAR",
    model_types=MODEL_TYPES,
    architectures=ARCHITECTURES,
    auto_map_names=(),
    rules=RULES,
    native_class="Qwen3ForCausalLM",
    native_config=qwen3_config,
    weights=dense_checkpoint,  # this rank's slices only, under tensor parallel
    tensor_names=tensor_names,
)

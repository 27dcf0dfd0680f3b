"""SDAR family (SDAR, TraDo and their kin): same-position predictions on a Qwen3 backbone.

The checkpoint's ``config.json`` says ``model_type: sdar`` and points at remote code; we never run that
code. Its weights use Qwen3's names, so the model is transformers' native ``Qwen3ForCausalLM`` driven
with 4-D masks (see :mod:`s2d2.families.hf`).
"""

from __future__ import annotations

from typing import Any

from .checkpoint_facts import FamilyRules
from .hf import qwen_config
from .loader import FamilySpec
from .sharding import dense_checkpoint
from .tensor_names import mlp, qwen_names

FAMILY = "sdar"
MODEL_TYPES = ("sdar", "trado")
ARCHITECTURES = ("SDARForCausalLM", "TraDoForCausalLM")
MASK_TOKENS = ("<|MASK|>", "<|mask|>", "<mask>", "|<MASK>|")
#: SDAR's published checkpoints are run with blocks of 4 (their ``-bN`` variants say otherwise by name).
RULES = FamilyRules(mask_tokens=MASK_TOKENS, published_block_size=4)

#: ``config.json`` fields taken as they are beyond :data:`~.hf.QWEN_KEYS`
_QWEN3_KEYS = ("head_dim", "attention_bias")



def tensor_names(config: dict[str, Any]) -> list[str]:
    """The checkpoint tensors this family reads (Qwen3's names)."""
    bias = bool(config.get("attention_bias"))
    return qwen_names(config, qk_norm=True, qkv_bias=bias, o_bias=bias, mlp_of=lambda i, p: mlp(p))


def qwen3_config(config: dict[str, Any]) -> Any:
    """The ``Qwen3Config`` of an SDAR checkpoint's ``config.json`` (``head_dim``: hidden size / heads where
    it gives none)."""
    from transformers import Qwen3Config

    if config.get("head_dim") is not None:
        return qwen_config(Qwen3Config, config, _QWEN3_KEYS)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return qwen_config(Qwen3Config, config, _QWEN3_KEYS, head_dim=head_dim)


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

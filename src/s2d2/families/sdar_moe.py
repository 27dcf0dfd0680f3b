"""SDAR-MoE family (SDAR-30B-A3B-Chat, -Sci and their kin): same-position predictions on a Qwen3-MoE backbone.

The checkpoint's ``config.json`` says ``model_type: sdar_moe`` / ``SDARMoeForCausalLM`` and points at
remote code (``auto_map``: ``configuration_sdar_moe.SDARMoeConfig``, ``modeling_sdar_moe.SDARMoe*``); we
never run that code. The network is Qwen3-MoE's, so the model is transformers' native
``Qwen3MoeForCausalLM`` driven with SDAR's 4-D block masks and mask token, exactly as dense SDAR runs on
``Qwen3ForCausalLM`` (:mod:`.sdar`). Its weights use Qwen3-MoE's names; only the experts are restacked:

==================================================  ============================================
SDAR-MoE checkpoint                                 Qwen3MoeForCausalLM
==================================================  ============================================
``mlp.gate.weight`` ``[E, hidden]``                 ``mlp.gate.weight`` (the router)
``mlp.experts.E.{gate,up}_proj.weight`` (E=0..n-1)  ``mlp.experts.gate_up_proj`` ``[n, 2I, hidden]``
``mlp.experts.E.down_proj.weight``                  ``mlp.experts.down_proj`` ``[n, hidden, I]``
``mlp.{gate,up,down}_proj.weight`` (dense layers)   the same
==================================================  ============================================

Layer ``i`` is sparse (routed experts) iff ``i`` is not in ``mlp_only_layers`` and
``(i + 1) % decoder_sparse_step == 0`` (with ``num_experts > 0``); the other layers are dense MLPs of
``intermediate_size``. The router is a softmax over the experts, top ``num_experts_per_tok``, renormalised
iff ``norm_topk_prob``; the fast forward runs it as :class:`~s2d2.forward.routed_experts.RoutedExperts`
(deterministic, per token: batch == alone holds as for the dense families).

Tensor parallel (``load(..., tp=...)``): each rank reads only its slices (:mod:`.sharding`: heads, the
dense layers' columns, vocabulary) and its ``E / N`` experts whole, stacked from 0; the router stays whole
on every rank (:class:`~.expert_parallel.SoftmaxExpertShard`), so every rank routes a token over all the
experts, applies the ones it holds, and the layer's one all-reduce adds the ranks' parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_safetensors
from .checkpoint_facts import FamilyRules
from .expert_parallel import ExpertTensors, SoftmaxExpertShard, add_expert, split_experts, stacked_experts
from .loader import FamilySpec
from .sdar import MASK_TOKENS, qwen3_config
from .sharding import local_config, rank_weights
from .tensor_names import experts, mlp, qwen_names

FAMILY = "sdar_moe"
MODEL_TYPES = ("sdar_moe",)
ARCHITECTURES = ("SDARMoeForCausalLM",)
#: Remote-code module/class fragments named in ``auto_map``.
AUTO_MAP_NAMES = ("sdar_moe", "sdarmoe")
#: SDAR's block size when the config does not say (SDAR-MoE is served with blocks of 4).
RULES = FamilyRules(mask_tokens=MASK_TOKENS, published_block_size=4)




def sparse_layers(config: dict[str, Any]) -> list[int]:
    """The layers that route through experts (the dense-layer schedule of Qwen3-MoE)."""
    n_experts = int(config.get("num_experts") or 0)
    step = int(config.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in (config.get("mlp_only_layers") or [])}
    n_layers = int(config["num_hidden_layers"])
    return [i for i in range(n_layers) if n_experts > 0 and i not in dense and (i + 1) % step == 0]


def tensor_names(config: dict[str, Any]) -> list[str]:
    """The checkpoint tensors this family reads: dense SDAR's, with each sparse layer's router and
    per-expert MLPs."""
    sparse, n = set(sparse_layers(config)), int(config.get("num_experts") or 0)
    bias = bool(config.get("attention_bias"))

    def mlp_of(i: int, p: str) -> list[str]:
        return [f"{p}.gate.weight", *experts(p, n)] if i in sparse else mlp(p)

    return qwen_names(config, qk_norm=True, qkv_bias=bias, o_bias=bias, mlp_of=mlp_of)


def qwen3_moe_config(config: dict[str, Any]) -> Any:
    """A ``Qwen3MoeConfig`` computing what SDAR-MoE's remote code computes (attention as dense SDAR's)."""
    from transformers import Qwen3MoeConfig

    dense = qwen3_config(config)  # the attention, norms, rope and ids, exactly as dense SDAR maps them
    n_experts = int(config.get("num_experts") or 0)
    top_k = int(config.get("num_experts_per_tok", 8))
    if n_experts and not 1 <= top_k <= n_experts:
        raise ValueError(f"num_experts_per_tok {top_k} is not within 1..num_experts ({n_experts})")
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "pad_token_id")  # fmt: skip
    kwargs = {k: getattr(dense, k) for k in keys if getattr(dense, k, None) is not None}
    cfg = Qwen3MoeConfig(
        **kwargs,
        intermediate_size=int(config.get("intermediate_size") or 0),
        rope_parameters=dict(dense.rope_parameters),
        use_sliding_window=False,  # no family here uses a sliding window
        sliding_window=None,
        decoder_sparse_step=int(config.get("decoder_sparse_step") or 1),
        moe_intermediate_size=int(config.get("moe_intermediate_size") or 0),
        num_experts_per_tok=top_k,
        num_experts=n_experts,
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        mlp_only_layers=[int(i) for i in (config.get("mlp_only_layers") or [])],
    )
    cfg.head_dim = dense.head_dim
    return cfg


def stack_experts(weights: dict[str, torch.Tensor], n_experts: int) -> dict[str, torch.Tensor]:
    """Per-expert projections -> Qwen3-MoE's stacked ``experts.gate_up_proj`` / ``experts.down_proj``
    (see the module docstring); every other tensor keeps its name. ``weights`` is consumed (emptied) and
    each layer's per-expert tensors are dropped once stacked, so the copy costs one layer's experts."""
    out: dict[str, torch.Tensor] = {}
    experts: ExpertTensors = {}
    for name in list(weights):
        tensor = weights.pop(name)
        if not add_expert(experts, name, tensor):
            out[name] = tensor
    for layer in list(experts):
        out.update(stacked_experts(layer, experts.pop(layer), n_experts))
    return out


def checkpoint_weights(
    path: Path, config: dict[str, Any], qcfg: Any, tp: Any = None
) -> tuple[dict[str, torch.Tensor], Any, Any]:
    """The weights under the native names (experts stacked) and the config to build at. Under tensor
    parallelism, rank ``tp.rank``'s shard: only its slices of the checkpoint are read (:mod:`.sharding`),
    its ``E / N`` experts stacked from 0, and each sparse layer a
    :class:`~.expert_parallel.SoftmaxExpertShard` (the router whole, so every rank routes over all the
    experts)."""
    n_experts = qcfg.num_experts
    if tp is None:
        return stack_experts(load_safetensors(path), n_experts), qcfg, None
    weights = rank_weights(path, qcfg, tp.rank, tp.size, experts=n_experts)  # its experts from 0
    weights = stack_experts(weights, n_experts // tp.size)

    def prepare(m: torch.nn.Module) -> None:
        split_experts(m, qcfg, tp.rank, tp.size, SoftmaxExpertShard)

    return weights, local_config(qcfg, tp.size, experts=n_experts > 0), prepare


SPEC = FamilySpec(
    name=FAMILY,
    title="SDAR-MoE",
    model_types=MODEL_TYPES,
    architectures=ARCHITECTURES,
    auto_map_names=AUTO_MAP_NAMES,
    rules=RULES,
    native_class="Qwen3MoeForCausalLM",
    native_config=qwen3_moe_config,
    weights=checkpoint_weights,
    tensor_names=tensor_names,
)

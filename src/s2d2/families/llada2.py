"""LLaDA2.x family (``llada2_moe``, e.g. LLaDA2.0/2.1-mini): same-position predictions, MoE backbone.

The checkpoint's ``config.json`` says ``model_type: llada2_moe`` and points at remote code; we never run
that code and no native LLaDA2 class exists in transformers. The architecture is the one of transformers'
native ``Glm4MoeForCausalLM`` (q/k RMSNorm, partial rotary on the first dims of each head, sigmoid router
with an expert-score correction bias, group-limited top-k, shared experts, leading dense layers), so the
weights are remapped onto it:

=============================================  =======================================================
LLaDA2 checkpoint                              Glm4Moe
=============================================  =======================================================
``model.word_embeddings``                      ``model.embed_tokens``
``attention.query_key_value`` (rows Q|K|V)     ``self_attn.{q,k,v}_proj``
``attention.{query,key}_layernorm``            ``self_attn.{q,k}_norm``
``attention.dense``                            ``self_attn.o_proj``
``mlp.gate.expert_bias``                       ``mlp.gate.e_score_correction_bias``
``mlp.experts.E.{gate,up}_proj`` (E=0..n-1)    ``mlp.experts.gate_up_proj`` ``[n, 2*I, H]`` ([gate; up])
``mlp.experts.E.down_proj``                    ``mlp.experts.down_proj`` ``[n, H, I]``
=============================================  =======================================================

The mask id is not in ``config.json``; it comes from the tokenizer (``<|mask|>``).

Prefill variants (``load(..., prefill_mask=...)``):

* ``"official"`` (default): what the official code does. LLaDA2's ``generate`` and S2D2's reference driver
  pass the block-causal prefill mask as a float tensor of 1.0 (allowed) / 0.0 (blocked); the remote model
  hands square 4-D masks to SDPA unchanged, so the values are ADDED to the attention scores: +1 on the
  block-causal keys, +0 elsewhere, nothing masked. We pass exactly that additive float mask for the prefill
  forward. It is the default because it is how the published model is actually run (and how S2D2's LLaDA2
  numbers were obtained), so it reproduces the official outputs token for token.
* ``"block-causal"``: a real block-causal prefill (blocked keys excluded), what the mask evidently intends.

Only the prefill is affected: the official code commits later blocks with ``attention_mask=None`` (full
attention to the cache and the block itself), which equals our block-causal commit of an aligned block. A
token-causal prefill (``causal=True``) is always a real causal mask; the official code has no such mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..forward.kv_pool import KVState
from ..forward.segment import Segment
from ..layouts import family
from .base import ModelInfo
from .checkpoint import load_safetensors
from .checkpoint_facts import FamilyRules
from .expert_parallel import ExpertTensors, add_expert, split_experts, stacked_experts
from .hf import HFAdapter, rope_parameters
from .loader import FamilySpec
from .sharding import local_config, rank_weights
from .tensor_names import ends, experts, layer_norms, mlp

FAMILY = "llada2"
MODEL_TYPES = ("llada2_moe",)
ARCHITECTURES = ("LLaDA2MoeModelLM",)
#: Remote-code module/class fragments named in ``auto_map``.
AUTO_MAP_NAMES = ("llada2_moe", "llada2moe")
MASK_TOKENS = ("<|mask|>", "<|MASK|>", "|<MASK>|", "<mask>", "[MASK]")
PREFILL_MASKS = ("official", "block-causal")
DEFAULT_PREFILL_MASK = "official"
#: Block length 32 of the official generation code; the mask id 156895 the engines serving LLaDA2.x use
#: where no file names it (the published tokenizer files name ``<|mask|>`` but give no id); the official
#: generation code stops on ``<|endoftext|>``.
RULES = FamilyRules(
    mask_tokens=MASK_TOKENS, published_block_size=32, published_mask_id=156895, end_of_turn=("<|endoftext|>",)
)



def tensor_names(config: dict[str, Any]) -> list[str]:
    """The checkpoint tensors this family reads (LLaDA2's own names, before :func:`remap_weights`)."""
    names = ends(config, "model.word_embeddings.weight")
    n_experts, dense = int(config.get("num_experts") or 0), int(config.get("first_k_dense_replace") or 0)
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}"
        a = f"{p}.attention"
        names += layer_norms(p) + [f"{a}.query_key_value.weight", f"{a}.dense.weight"]
        names += [f"{a}.query_key_value.bias"] * bool(config.get("use_qkv_bias"))
        names += [f"{a}.dense.bias"] * bool(config.get("use_bias"))
        norms = [f"{a}.query_layernorm.weight", f"{a}.key_layernorm.weight"]
        names += norms * bool(config.get("use_qk_norm", True))
        if not n_experts or i < dense:
            names += mlp(f"{p}.mlp")
            continue
        names += [f"{p}.mlp.gate.weight"] + experts(f"{p}.mlp", n_experts)
        names += [f"{p}.mlp.gate.expert_bias"] * bool(config.get("moe_router_enable_expert_bias", True))
        names += mlp(f"{p}.mlp.shared_experts") * bool(config.get("num_shared_experts"))
    return names


def glm4_moe_config(config: dict[str, Any], *, attention_bias: bool) -> Any:
    """A ``Glm4MoeConfig`` computing what LLaDA2's remote code computes (its config class's defaults)."""
    from transformers import Glm4MoeConfig

    score = str(config.get("score_function", "sigmoid")).lower()
    if score != "sigmoid":
        raise ValueError(f"router score_function {score!r} is not supported (only sigmoid)")
    n_layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    n_experts = config.get("num_experts")
    top_k = int(config.get("num_experts_per_tok", 2))
    dense_first = int(config.get("first_k_dense_replace", 0))
    if not n_experts:  # dense model: every layer gets the dense MLP
        n_experts, dense_first = 1, n_layers
    theta, partial = float(config.get("rope_theta", 10000.0)), float(config.get("partial_rotary_factor", 0.5))
    rope = rope_parameters(config, theta, partial_rotary_factor=partial)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    optional = {k: config[k] for k in ids if config.get(k) is not None}
    return Glm4MoeConfig(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config.get("intermediate_size") or 0),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_act=str(config.get("hidden_act", "silu")),
        max_position_embeddings=int(config.get("max_position_embeddings", 16384)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        rope_parameters=rope,
        attention_bias=attention_bias,
        use_qk_norm=bool(config.get("use_qk_norm", True)),
        moe_intermediate_size=int(config.get("moe_intermediate_size") or 0),
        num_experts_per_tok=top_k,
        n_shared_experts=int(config.get("num_shared_experts") or 0),
        n_routed_experts=int(n_experts),
        routed_scaling_factor=float(config.get("routed_scaling_factor", 2.5)),
        n_group=int(config.get("n_group") or 1),
        topk_group=int(config.get("topk_group") or 1),
        first_k_dense_replace=dense_first,
        norm_topk_prob=top_k > 1,  # LLaDA2 normalises the top-k weights iff top_k > 1
        num_mtp_layers=0,
        **optional,
    )


def remap_weights(weights: dict[str, torch.Tensor], gcfg: Any) -> dict[str, torch.Tensor]:
    """LLaDA2 parameter names/layout -> ``Glm4MoeForCausalLM``'s (see the module docstring)."""
    heads, kv_heads, head_dim = gcfg.num_attention_heads, gcfg.num_key_value_heads, gcfg.head_dim
    split = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    out: dict[str, torch.Tensor] = {}
    experts: ExpertTensors = {}
    renames = {
        ".attention.dense.": ".self_attn.o_proj.",
        ".attention.query_layernorm.": ".self_attn.q_norm.",
        ".attention.key_layernorm.": ".self_attn.k_norm.",
        ".mlp.gate.expert_bias": ".mlp.gate.e_score_correction_bias",
    }
    for name, tensor in weights.items():
        if name == "model.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor
            continue
        if ".attention.query_key_value." in name:
            prefix, kind = name.split(".attention.query_key_value.")
            if tensor.shape[0] != sum(split):
                raise ModelLoadError(f"{name} has {tensor.shape[0]} rows, expected {sum(split)} (Q|K|V)")
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), tensor.split(split, dim=0), strict=True):
                out[f"{prefix}.self_attn.{proj}.{kind}"] = part
            continue
        if add_expert(experts, name, tensor):
            continue
        for old, new in renames.items():
            if old in name:
                name = name.replace(old, new)
                break
        out[name] = tensor
    n = gcfg.n_routed_experts
    for layer, per_expert in experts.items():
        out.update(stacked_experts(layer, per_expert, n))
        bias = f"{layer}.gate.e_score_correction_bias"
        if bias not in out:  # LLaDA2 always adds expert_bias (zeros unless trained): default to zeros
            gate = out.get(f"{layer}.gate.weight")  # every expert's (a tensor-parallel rank holds n of them)
            out[bias] = torch.zeros(n if gate is None else gate.shape[0])
        if gcfg.n_shared_experts == 0:  # no shared expert: an empty (zero-output) MLP in Glm4Moe
            hidden = gcfg.hidden_size
            shapes = {"gate_proj": (0, hidden), "up_proj": (0, hidden), "down_proj": (hidden, 0)}
            for proj, shape in shapes.items():
                out.setdefault(f"{layer}.shared_experts.{proj}.weight", torch.zeros(shape))
    return out


def _bad_prefill_mask(value: Any) -> ModelLoadError:
    return ModelLoadError(f"unknown prefill_mask {value!r}; choose one of {', '.join(PREFILL_MASKS)}")


class LLaDA2Adapter(HFAdapter):
    """LLaDA2.x on a native ``Glm4MoeForCausalLM``; same-position, so only the prefill differs: the
    official one is the ``prefill_bias`` trait of its :class:`~.base.ModelInfo`."""

    def __init__(
        self,
        model: torch.nn.Module,
        info: ModelInfo,
        path: Path | None = None,
        *,
        prefill_mask: str = DEFAULT_PREFILL_MASK,
        tp: Any = None,
    ):
        super().__init__(model, info, path, tp=tp)
        if prefill_mask not in PREFILL_MASKS:
            raise _bad_prefill_mask(prefill_mask)
        self.prefill_mask = prefill_mask
        #: the family trait the layouts read (:attr:`~.base.ModelInfo.prefill_bias`)
        self.info.prefill_bias = prefill_mask == "official"

    def _prefill_forward(
        self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool, n_logits: int
    ) -> torch.Tensor:
        """The prefill forward (writes ``ids``); returns its last ``n_logits`` rows (for tests)."""
        seg = Segment.of(
            state, family.prefill(self.info, state.length, ids, block_size=block_size, causal=causal)
        )
        seg.logit_rows = Segment.last_rows(seg.n, n_logits)
        return self.run_and_keep([seg])[0]


def checkpoint_weights(
    path: Path, config: dict[str, Any], gcfg: Any, tp: Any = None
) -> tuple[dict[str, torch.Tensor], Any, Any]:
    """The weights remapped onto Glm4Moe's names and the config to build at (with a q/k/v bias where the
    checkpoint has one); under tensor parallelism the rank's sizes, slices and experts (renumbered from
    0)."""
    if tp is None:
        weights = load_safetensors(path)
    else:  # the rank's slices (:mod:`.sharding`, at the native sizes), its experts numbered from 0
        weights = rank_weights(path, gcfg, tp.rank, tp.size, experts=int(config.get("num_experts") or 0))
    if any(k.endswith(".attention.dense.bias") for k in weights):
        raise ModelLoadError(f"{path}: LLaDA2 with an attention output bias (use_bias) is not supported")
    if any(k.endswith(".attention.query_key_value.bias") for k in weights):
        gcfg = glm4_moe_config(config, attention_bias=True)
    if tp is None:
        return remap_weights(weights, gcfg), gcfg, None
    native = local_config(gcfg, tp.size, experts=bool(config.get("num_experts")))

    def prepare(m: torch.nn.Module) -> None:
        split_experts(m, gcfg, tp.rank, tp.size)

    return remap_weights(weights, native), native, prepare


SPEC = FamilySpec(
    name=FAMILY,
    title="LLaDA2",
    model_types=MODEL_TYPES,
    architectures=ARCHITECTURES,
    auto_map_names=AUTO_MAP_NAMES,
    rules=RULES,
    native_class="Glm4MoeForCausalLM",
    native_config=lambda config: glm4_moe_config(config, attention_bias=False),
    weights=checkpoint_weights,
    tensor_names=tensor_names,
    adapter=LLaDA2Adapter,
    options=("prefill_mask",),
    max_length=16384,
)

"""The tensor names a family reads from a checkpoint, from its ``config.json`` alone (no weights).

Each family module's ``tensor_names(config)`` builds its list from these pieces; ``s2d2 info`` compares
it with a checkpoint's ``model.safetensors.index.json`` (missing and unexpected names), and the
conformance tests with the checkpoints' own files.
"""

from __future__ import annotations

from typing import Any

#: The projections of a gated MLP (and of each expert).
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def mlp(prefix: str) -> list[str]:
    """A gated MLP's weights under ``prefix`` (``model.layers.0.mlp``)."""
    return [f"{prefix}.{p}.weight" for p in MLP_PROJECTIONS]


def experts(prefix: str, n_experts: int) -> list[str]:
    """Per-expert weights ``prefix.experts.E.{gate,up,down}_proj.weight`` for E in ``[0, n_experts)``."""
    return [name for e in range(n_experts) for name in mlp(f"{prefix}.experts.{e}")]


def qwen_attention(prefix: str, *, qk_norm: bool, qkv_bias: bool, o_bias: bool = False) -> list[str]:
    """Qwen2/Qwen3-style attention weights under ``prefix`` (``model.layers.0.self_attn``)."""
    names = [f"{prefix}.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    names += [f"{prefix}.{p}.bias" for p in ("q_proj", "k_proj", "v_proj") if qkv_bias]
    names += [f"{prefix}.o_proj.bias"] * o_bias
    names += [f"{prefix}.{p}.weight" for p in ("q_norm", "k_norm") if qk_norm]
    return names


def layer_norms(prefix: str) -> list[str]:
    return [f"{prefix}.input_layernorm.weight", f"{prefix}.post_attention_layernorm.weight"]


def ends(config: dict[str, Any], embedding: str = "model.embed_tokens.weight") -> list[str]:
    """The embedding, the final norm and (unless tied to the embedding) the LM head."""
    head = [] if config.get("tie_word_embeddings") else ["lm_head.weight"]
    return [embedding, "model.norm.weight", *head]


def qwen_names(
    config: dict[str, Any], *, qk_norm: bool, qkv_bias: bool, o_bias: bool, mlp_of: Any
) -> list[str]:
    """A Qwen-style decoder's names; ``mlp_of(i, prefix)`` gives layer ``i``'s MLP (dense or experts)."""
    names = ends(config)
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}"
        names += layer_norms(p) + qwen_attention(f"{p}.self_attn", qk_norm=qk_norm, qkv_bias=qkv_bias,
                                                 o_bias=o_bias) + mlp_of(i, f"{p}.mlp")  # fmt: skip
    return names

"""A tiny random-weight SDAR-MoE checkpoint in the family's on-disk format, written by the tests.

``config.json`` has the keys of the published SDAR-30B-A3B-Chat config (``SDARMoeForCausalLM``,
``model_type: sdar_moe``, ``auto_map`` to ``configuration_sdar_moe`` / ``modeling_sdar_moe``, Qwen3-MoE's
sizes and MoE keys) with small sizes and the token ids of the dense SDAR fixture: hidden 64, 2 layers,
4 query heads, 2 KV heads, head_dim 32 (``heads * head_dim != hidden``), vocab 512, mask 509, bos/eos 503,
``block_size`` 4; 4 experts, top-2 routing with ``norm_topk_prob``; layer 0 dense (``mlp_only_layers``,
``intermediate_size`` 128), layer 1 sparse (``moe_intermediate_size`` 32).

``model.safetensors`` (bf16) uses the published tensor names: Qwen3's attention and norms,
``mlp.{gate,up,down}_proj`` in the dense layer, ``mlp.gate.weight`` (the router) and
``mlp.experts.E.{gate,up,down}_proj.weight`` per expert in the sparse one. Values are seeded random numbers
rounded to bf16, so loading them as float32 is exact. No remote code is written.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 2, 4, 2, 32
VOCAB, MASK, EOS = 512, 509, 503
INTER, MOE_INTER, EXPERTS, TOP_K = 128, 32, 4, 2


def sdar_moe_config(vocab: int = VOCAB) -> dict:
    """The config.json (``vocab`` other than 512: mask ``vocab - 1``, bos/eos ``vocab - 2``)."""
    mask, eos = (MASK, EOS) if vocab == VOCAB else (vocab - 1, vocab - 2)
    return {
        "architectures": ["SDARMoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
            "AutoModel": "modeling_sdar_moe.SDARMoeModel",
            "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM",
        },
        "block_size": 4,
        "bos_token_id": eos,
        "decoder_sparse_step": 1,
        "eos_token_id": eos,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "mask_token_id": mask,
        "max_position_embeddings": 2048,
        "max_window_layers": LAYERS,
        "mlp_only_layers": [0],
        "model_type": "sdar_moe",
        "moe_intermediate_size": MOE_INTER,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.52.4",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def sdar_moe_weights(seed: int = 0, std: float = 0.3, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by their published names (bf16)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)

    w = {"model.embed_tokens.weight": rand(vocab, HIDDEN, scale=1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = norm(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * HEAD_DIM)
        w[p + "self_attn.q_norm.weight"] = norm(HEAD_DIM)
        w[p + "self_attn.k_norm.weight"] = norm(HEAD_DIM)
        if i == 0:  # dense (mlp_only_layers)
            w[p + "mlp.gate_proj.weight"] = rand(INTER, HIDDEN)
            w[p + "mlp.up_proj.weight"] = rand(INTER, HIDDEN)
            w[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTER)
        else:
            w[p + "mlp.gate.weight"] = rand(EXPERTS, HIDDEN, scale=0.05)
            for e in range(EXPERTS):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = rand(MOE_INTER, HIDDEN)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = rand(MOE_INTER, HIDDEN)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = rand(HIDDEN, MOE_INTER)
    w["model.norm.weight"] = norm(HIDDEN)
    w["lm_head.weight"] = rand(vocab, HIDDEN, scale=0.6)
    return w


def make_random_sdar_moe(directory: Path, *, seed: int = 0, vocab: int = VOCAB) -> Path:
    """Write the checkpoint (config.json + model.safetensors) into ``directory``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(sdar_moe_weights(seed, vocab=vocab), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(sdar_moe_config(vocab), indent=1))
    return directory


def make_sdar_moe_with_tokenizer(directory: Path) -> Path:
    """The checkpoint over the byte-level BPE tokenizer of :mod:`structured_fixtures` (a vocabulary that
    can write JSON), for the CLI and server tests that speak text."""
    from structured_fixtures import write_json_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    return make_random_sdar_moe(directory, vocab=write_json_tokenizer(directory))


_CACHED: list[Path] = []


def sdar_moe_checkpoint() -> Path:
    """The checkpoint, written once a test process (a temporary directory)."""
    if not _CACHED:
        _CACHED.append(make_random_sdar_moe(Path(tempfile.mkdtemp(prefix="s2d2-sdar-moe-"))))
    return _CACHED[0]

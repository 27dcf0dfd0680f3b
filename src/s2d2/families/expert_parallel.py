"""Expert parallelism for the mixture-of-experts layers of a tensor-parallel rank (LLaDA2 on Glm4Moe).

Each rank holds ``E / N`` routed experts whole (``[r E/N, (r+1) E/N)``), the router whole (small:
``[E, hidden]``, replicated, so every rank picks the same experts for every token) and its columns of
the shared experts. A layer's output on one rank is the part of the sum its experts and its shared
columns give; the forward adds the ranks' parts with ONE all-reduce per layer
(:func:`~s2d2.forward.paged_forward.layer_forward`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class ExpertShard(torch.nn.Module):
    """A Glm4Moe mixture-of-experts layer's share on one rank: ``gate`` (the whole router), ``experts``
    (the native experts module of this rank's ``E / N`` experts), ``shared_experts`` (this rank's columns).
    ``forward(h)`` ``[T, hidden]`` -> this rank's partial sum ``[T, hidden]``."""

    def __init__(self, full_config: Any, local_config: Any, rank: int, size: int):
        from transformers.models.glm4_moe import modeling_glm4_moe as glm

        super().__init__()
        self.gate = glm.Glm4MoeTopkRouter(full_config)
        self.experts = glm.Glm4MoeExperts(local_config)
        # transformers' expert kernels then skip (and zero) the pairs routed to index E_local (elsewhere)
        self.experts._is_expert_parallel = True
        self.per_rank = full_config.n_routed_experts // size
        self.first = rank * self.per_rank
        shared = full_config.moe_intermediate_size * full_config.n_shared_experts
        self.shared_experts = glm.Glm4MoeMLP(local_config, intermediate_size=shared // size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        flat = h.reshape(-1, h.shape[-1])
        _, weights, index = self.gate(flat)
        local = index - self.first
        elsewhere = (local < 0) | (local >= self.per_rank)
        # index E_local is skipped by the experts: an expert another rank holds adds nothing here
        local = local.masked_fill(elsewhere, self.per_rank)
        return (self.experts(flat, local, weights) + self.shared_experts(flat)).view(h.shape)


def split_experts(model: torch.nn.Module, full_config: Any, rank: int, size: int) -> None:
    """Replace each mixture-of-experts layer of the native ``model`` (built at the rank's sizes) by its
    :class:`ExpertShard` (before the rank's weights are loaded into it)."""
    local = copy.deepcopy(model.config)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "experts"):
            shard = ExpertShard(full_config, local, rank, size)
            dtype = layer.mlp.experts.gate_up_proj.dtype  # the router keeps its own (float32)
            shard.experts.to(dtype)
            shard.shared_experts.to(dtype)
            layer.mlp = shard


def renumber_experts(weights: dict[str, torch.Tensor], first: int) -> dict[str, torch.Tensor]:
    """The rank's expert tensors (checkpoint names ``...mlp.experts.E....``) renumbered from 0."""
    import re

    pattern = re.compile(r"(\.mlp\.experts\.)(\d+)(\.)")
    return {pattern.sub(lambda m: f"{m[1]}{int(m[2]) - first}{m[3]}", k): v for k, v in weights.items()}

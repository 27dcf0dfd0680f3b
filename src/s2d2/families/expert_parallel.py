"""Expert parallelism for the mixture-of-experts layers of a tensor-parallel rank (LLaDA2 on Glm4Moe,
SDAR-MoE on Qwen3-MoE).

Each rank holds ``E / N`` routed experts whole (``[r E/N, (r+1) E/N)``), the router whole (small:
``[E, hidden]``, replicated, so every rank picks the same experts for every token) and its columns of
the shared experts (Glm4Moe; Qwen3-MoE has none). A layer's output on one rank is the part of the sum its
experts and its shared columns give; the forward adds the ranks' parts with ONE all-reduce per layer
(:func:`~s2d2.forward.paged_forward.layer_forward`; a Qwen3-MoE shard runs there as
:class:`~s2d2.forward.routed_experts.RoutedExperts` over its slice, ``first`` its first expert id).

Both families' checkpoints hold each expert's projections apart; :func:`add_expert` and
:func:`stacked_experts` restack them as the native experts modules hold them (whole or a rank's share).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from ..errors import ModelLoadError

#: A routed expert's projection in a checkpoint: ``<layer>.mlp.experts.<e>.<gate|up|down>_proj.weight``.
EXPERT_WEIGHT = re.compile(
    r"^(?P<layer>.+\.mlp)\.experts\.(?P<e>\d+)\.(?P<proj>(gate|up|down)_proj)\.weight$"
)
#: one layer's routed experts: expert -> projection -> tensor
LayerExperts = dict[int, dict[str, torch.Tensor]]
#: layer -> its routed experts
ExpertTensors = dict[str, LayerExperts]


def add_expert(experts: ExpertTensors, name: str, tensor: torch.Tensor) -> bool:
    """File ``tensor`` in ``experts`` under its layer, expert and projection if ``name`` is a routed
    expert's projection (:data:`EXPERT_WEIGHT`); whether it was."""
    m = EXPERT_WEIGHT.match(name)
    if m:
        experts.setdefault(m["layer"], {}).setdefault(int(m["e"]), {})[m["proj"]] = tensor
    return m is not None


def stacked_experts(layer: str, per_expert: LayerExperts, n: int) -> dict[str, torch.Tensor]:
    """Experts ``0..n-1`` of ``layer`` (``per_expert[e][proj]``) as the native experts module holds them:
    ``<layer>.experts.gate_up_proj`` ``[n, 2I, hidden]`` (gate over up) and ``<layer>.experts.down_proj``
    ``[n, hidden, I]``; a :class:`ModelLoadError` when a projection or an expert is missing."""
    if sorted(per_expert) != list(range(n)) or any(len(p) != 3 for p in per_expert.values()):
        raise ModelLoadError(f"{layer}.experts: expected gate/up/down projections of experts 0..{n - 1}")
    gate_up = [torch.cat([per_expert[e]["gate_proj"], per_expert[e]["up_proj"]]) for e in range(n)]
    down = [per_expert[e]["down_proj"] for e in range(n)]
    return {
        f"{layer}.experts.gate_up_proj": torch.stack(gate_up),
        f"{layer}.experts.down_proj": torch.stack(down),
    }


class _RoutedShard(torch.nn.Module):
    """A mixture-of-experts layer's routed share on one rank: ``gate`` (the whole router), ``experts`` (the
    native experts module of this rank's ``per_rank`` experts), ``first`` (the expert id of its expert
    0). :meth:`routed` is their part of the layer's output."""

    def __init__(self, gate: torch.nn.Module, experts: torch.nn.Module, n_experts: int, rank: int, size: int):
        super().__init__()
        self.gate = gate
        self.experts = experts
        # transformers' expert kernels then skip (and zero) the pairs routed to index E_local (elsewhere)
        self.experts._is_expert_parallel = True
        self.per_rank = n_experts // size
        self.first = rank * self.per_rank

    def routed(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` ``[T, hidden]`` -> what this rank's experts add for the experts the router picks."""
        _, weights, index = self.gate(flat)
        return self.experts(flat, _local_index(index, self.first, self.per_rank), weights)


class ExpertShard(_RoutedShard):
    """A Glm4Moe mixture-of-experts layer's share on one rank: ``gate`` (the whole router), ``experts``
    (the native experts module of this rank's ``E / N`` experts), ``shared_experts`` (this rank's columns).
    ``forward(h)`` ``[T, hidden]`` -> this rank's partial sum ``[T, hidden]``."""

    def __init__(self, full_config: Any, local_config: Any, rank: int, size: int):
        from transformers.models.glm4_moe import modeling_glm4_moe as glm

        gate, experts = glm.Glm4MoeTopkRouter(full_config), glm.Glm4MoeExperts(local_config)
        super().__init__(gate, experts, full_config.n_routed_experts, rank, size)
        shared = full_config.moe_intermediate_size * full_config.n_shared_experts
        self.shared_experts = glm.Glm4MoeMLP(local_config, intermediate_size=shared // size)

    #: the sub-modules cast to the model's dtype (the Glm4Moe router keeps its own: float32)
    CAST = ("experts", "shared_experts")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        flat = h.reshape(-1, h.shape[-1])
        return (self.routed(flat) + self.shared_experts(flat)).view(h.shape)


class SoftmaxExpertShard(_RoutedShard):
    """A Qwen3-MoE mixture-of-experts layer's share on one rank: ``gate`` (the whole softmax top-k router:
    the top k of all ``E`` experts, renormalised iff ``norm_topk_prob``), ``experts`` (the native experts
    module of this rank's ``E / N`` experts), ``first`` (the expert id of its expert 0). ``forward(h)``
    ``[..., hidden]`` -> this rank's partial sum, the same shape."""

    #: the sub-modules cast to the model's dtype (the router too, as in the native model)
    CAST = ("gate", "experts")

    def __init__(self, full_config: Any, local_config: Any, rank: int, size: int):
        from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen

        gate, experts = qwen.Qwen3MoeTopKRouter(full_config), qwen.Qwen3MoeExperts(local_config)
        super().__init__(gate, experts, full_config.num_experts, rank, size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.routed(h.reshape(-1, h.shape[-1])).view(h.shape)


def _local_index(index: torch.Tensor, first: int, per_rank: int) -> torch.Tensor:
    """Expert ids ``[T, k]`` -> this rank's (``first`` is 0); index ``per_rank`` where another rank holds the
    expert (the native experts skip it: it adds nothing here)."""
    local = index - first
    return local.masked_fill((local < 0) | (local >= per_rank), per_rank)


def split_experts(
    model: torch.nn.Module, full_config: Any, rank: int, size: int, shard: type = ExpertShard
) -> None:
    """Replace each mixture-of-experts layer of the native ``model`` (built at the rank's sizes) by its
    ``shard`` (:class:`ExpertShard` for Glm4Moe, :class:`SoftmaxExpertShard` for Qwen3-MoE; before the
    rank's weights are loaded into it)."""
    local = copy.deepcopy(model.config)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "experts"):
            part = shard(full_config, local, rank, size)
            dtype = layer.mlp.experts.gate_up_proj.dtype
            for name in shard.CAST:
                getattr(part, name).to(dtype)
            layer.mlp = part


def renumber_experts(weights: dict[str, torch.Tensor], first: int) -> dict[str, torch.Tensor]:
    """The rank's expert tensors (checkpoint names ``...mlp.experts.E....``) renumbered from 0."""
    import re

    pattern = re.compile(r"(\.mlp\.experts\.)(\d+)(\.)")
    return {pattern.sub(lambda m: f"{m[1]}{int(m[2]) - first}{m[3]}", k): v for k, v in weights.items()}

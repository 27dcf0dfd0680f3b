"""What a transformer's step cost depends on: its sizes (read from a transformers-style config.json),
dense or mixture-of-experts, and what one rank of a tensor-parallel forward holds and reads.

Tensor parallelism over ``tp`` ranks (as :mod:`s2d2` shards a model):

* attention: query heads and the output projection split by heads; key/value heads split too, or, when
  there are fewer key/value heads than ranks, one replicated on each rank;
* dense MLP: split ``tp`` ways (gate/up by columns, down by rows);
* mixture-of-experts layers: the routed experts split across ranks (expert parallel), the shared experts
  split like a dense MLP, the router replicated;
* embedding and LM head: vocab-parallel; norms replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import S2D2Error


@dataclass(frozen=True)
class ModelShape:
    """A transformer's sizes. ``experts`` 0: a dense model (every layer has the ``intermediate`` MLP);
    else the first ``dense_layers`` layers have it and the others are MoE layers of ``experts`` routed
    experts (``experts_per_token`` chosen per token) and ``shared_experts``, each a gated MLP of
    ``moe_intermediate``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_value: int = 2
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    dense_layers: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            experts = int(config.get("num_experts") or config.get("n_routed_experts") or 0)
            moe: dict[str, int] = {}
            if experts:
                moe = dict(
                    experts=experts,
                    experts_per_token=int(config["num_experts_per_tok"]),
                    shared_experts=int(
                        config.get("num_shared_experts") or config.get("n_shared_experts") or 0
                    ),
                    moe_intermediate=int(config["moe_intermediate_size"]),
                    dense_layers=_dense_layers(config),
                )
            # an MoE model without dense layers may leave intermediate_size out
            intermediate = config.get("intermediate_size") if experts else config["intermediate_size"]
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(intermediate or 0),
                vocab=int(config["vocab_size"]),
                **moe,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise S2D2Error(f"the shape config lacks a transformer setting: {exc}") from None

    # ------------------------------------------------------------------ sizes (parameters)
    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def attention_params(self) -> int:
        """One layer's q, k, v and o projections."""
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

    @property
    def expert_params(self) -> int:
        """One expert (a gated MLP of ``moe_intermediate``)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def router_params(self) -> int:
        """Every MoE layer's router together (replicated on every rank)."""
        return self.moe_layers * self.hidden * self.experts

    @property
    def params(self) -> int:
        """Weights one token's forward multiplies by (attention, the gated MLP or the chosen and shared
        experts and the router, LM head; embeddings are gathered): the FLOPs basis, and for a dense model
        the weights read by one forward."""
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        active = self.moe_layers * (self.experts_per_token + self.shared_experts) * self.expert_params
        head = self.hidden * self.vocab
        return self.layers * self.attention_params + dense + active + self.router_params + head

    @property
    def total_params(self) -> int:
        """Every weight held: all experts, the embedding and the norms too."""
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        experts = self.moe_layers * (self.experts + self.shared_experts) * self.expert_params
        norms = self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden
        head_and_embedding = 2 * self.hidden * self.vocab
        attn = self.layers * self.attention_params
        return attn + dense + experts + self.router_params + head_and_embedding + norms

    # ------------------------------------------------------------------ one rank of ``tp``
    def check_tensor_parallel(self, tp: int) -> None:
        """A one-line error unless ``tp`` ranks can shard this model: it divides the attention heads, the
        key/value heads divide by it or it by them, and it divides the routed experts."""
        if tp < 1:
            raise S2D2Error(f"tensor_parallel_size must be >= 1, got {tp}")
        if self.heads % tp:
            raise S2D2Error(f"tensor_parallel_size {tp} must divide the model's {self.heads} attention heads")
        if self.kv_heads % tp and tp % self.kv_heads:
            raise S2D2Error(
                f"tensor_parallel_size {tp} and the model's {self.kv_heads} key/value heads: one must divide "
                "the other"
            )
        if self.experts and self.experts % tp:
            raise S2D2Error(f"tensor_parallel_size {tp} must divide the model's {self.experts} experts")

    def kv_heads_per_rank(self, tp: int) -> int:
        """Key/value heads one rank holds (one replicated per rank when there are fewer than ranks)."""
        return self.kv_heads // tp if self.kv_heads >= tp else 1

    def kv_bytes_per_position(self, tp: int = 1) -> int:
        """Keys and values one cached position takes on one rank, over all layers."""
        return self.bytes_per_value * 2 * self.layers * self.kv_heads_per_rank(tp) * self.head_dim

    def experts_touched(self, tokens: int) -> float:
        """Distinct routed experts a forward of ``tokens`` tokens reads in one MoE layer, expected under
        uniform routing: E (1 - (1 - k/E)^T)."""
        if not self.experts or tokens <= 0:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens)

    def read_params(self, tokens: int, tp: int = 1) -> float:
        """Weights one rank reads in a forward of ``tokens`` tokens: its shards of attention, the dense
        MLPs, the shared experts and the LM head, its share of the routed experts the tokens touch, and
        the replicated router. For a dense model on one rank, :attr:`params` exactly."""
        q_o = self.hidden * self.head_dim * 2 * self.heads / tp
        k_v = self.hidden * self.head_dim * 2 * self.kv_heads_per_rank(tp)
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate / tp
        moe = self.moe_layers * self.expert_params * (self.shared_experts + self.experts_touched(tokens)) / tp
        head = self.hidden * self.vocab / tp
        return self.layers * (q_o + k_v) + dense + moe + self.router_params + head

    def held_params(self, tp: int = 1) -> float:
        """Weights one rank holds: its shards plus the replicated parts (norms, router, key/value heads
        when fewer than ranks)."""
        attn = self.hidden * self.head_dim * (2 * self.heads / tp + 2 * self.kv_heads_per_rank(tp))
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate / tp
        experts = self.moe_layers * (self.experts + self.shared_experts) * self.expert_params / tp
        norms = self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden
        head_and_embedding = 2 * self.hidden * self.vocab / tp
        return self.layers * attn + dense + experts + self.router_params + head_and_embedding + norms

    def flops(self, tokens: int, attention: float, tp: int = 1) -> float:
        """One rank's FLOPs for ``tokens`` tokens and ``attention`` query-key pairs: the split weights'
        2 x params x tokens over ``tp`` (experts assumed balanced across ranks), the replicated router's in
        full, and the attention's over ``tp``."""
        split = self.params - self.router_params
        return (
            2 * split * tokens / tp
            + 2 * self.router_params * tokens
            + 4 * self.layers * self.heads * self.head_dim * attention / tp
        )


__all__ = ["ModelShape"]


def _dense_layers(config: dict[str, Any]) -> int:
    """How many layers of a mixture-of-experts config have a dense MLP: the first ``first_k_dense_replace``
    (Glm4-MoE, DeepSeek), else those in ``mlp_only_layers`` or off the ``decoder_sparse_step`` schedule
    (Qwen3-MoE: layer ``i`` routes iff ``(i + 1) % step == 0``)."""
    if config.get("first_k_dense_replace") is not None:
        return int(config["first_k_dense_replace"])
    step = int(config.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in (config.get("mlp_only_layers") or [])}
    return sum(1 for i in range(int(config["num_hidden_layers"])) if i in dense or (i + 1) % step)

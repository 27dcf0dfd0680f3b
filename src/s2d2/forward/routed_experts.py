"""Routed experts: a softmax top-k router over stacked SwiGLU experts, for packed tokens ``[T, hidden]``.

The mixture-of-experts MLP of Qwen3-MoE-style decoders (the SDAR-MoE family runs on it):

* **router**: ``p = softmax(x @ W_r^T)`` in float32 over the ``E`` experts; each token keeps its ``k``
  largest (``torch.topk``: ties go to the lower expert id); with ``normalize`` (``norm_topk_prob``) the
  ``k`` kept probabilities are divided by their sum; the weights are then cast to the hidden dtype;
* **experts**: expert ``e`` is ``down[e] @ (silu(gate[e] @ x) * (up[e] @ x))``, its weights stacked by
  expert id (``gate_up`` ``[E, 2I, hidden]`` = [gate; up], ``down`` ``[E, hidden, I]``);
* **combine**: ``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])``, summed over ``j = 0..k-1`` in rank
  order: the ONE reduction point.

Batch invariance: a token's route is a function of its own hidden state only (its row of the router
product, a per-row softmax and top-k; no capacity limit, no token dropping, no load balancing at
inference), never of the other tokens of the batch, and its output is combined in a fixed order (its own
ranks), so a row's expert assignment and its sum do not depend on its batch-mates. The tokens routed to
an expert are computed together, each as its own row of the product; as in every dense layer, the batch's
shape may change the products' float rounding, which can change a route only where two experts'
probabilities tie to rounding (where a greedy argmax could flip as well).

Expert parallelism: :class:`RoutedExperts` may hold a contiguous slice of the experts (``first`` is the
expert id of ``gate_up[0]``); :meth:`RoutedExperts.forward` then computes only the slots routed to its
slice (the others contribute zero), and the sum of every slice's output (one all-reduce at the reduction
point) is the full layer's output. The router is replicated.

Two ways to run the experts, the same function: one product pair an expert on its tokens (the expert
counts read on the host, one sync a layer), or, where ``torch._grouped_mm`` runs on the weights' device
and dtype (:func:`grouped_ok`), two grouped products over all slots sorted by expert, with no host read.
Only the grouped way can be captured in a CUDA graph (see :mod:`~s2d2.forward.fastpath`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RoutedExperts:
    """One layer's router and (a slice of) its experts; shapes in the module docstring."""

    router: torch.Tensor  # [E, hidden], every expert (replicated)
    gate_up: torch.Tensor  # [E_local, 2I, hidden]
    down: torch.Tensor  # [E_local, hidden, I]
    top_k: int
    normalize: bool
    #: expert id of ``gate_up[0]`` (0 unless the experts are split across devices)
    first: int = 0
    #: run the experts as two grouped products (``torch._grouped_mm``, no host sync) instead of a product
    #: pair an expert; :func:`routed_experts_of` sets it where :func:`grouped_ok` holds
    grouped: bool = False

    @property
    def n_experts(self) -> int:
        return self.router.shape[0]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's expert ids ``[T, k]`` (descending probability) and weights ``[T, k]`` (x's dtype)."""
        probs = torch.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float32)
        top, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return ids, top.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's MLP output ``[T, hidden]`` for the packed tokens ``x`` ``[T, hidden]`` (this slice's
        share of it when the experts are split)."""
        ids, weights = self.route(x)
        slots = self.expert_slots(x, ids)  # [T, k, hidden]
        return (slots * weights[..., None]).sum(dim=1)  # the reduction point

    def expert_slots(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Each (token, rank) slot's expert output ``[T, k, hidden]`` (zero where the slot's expert is not in
        this slice). The slots are sorted by expert id and each expert runs once on its tokens."""
        return self.grouped_slots(x, ids) if self.grouped else self.looped_slots(x, ids)

    def looped_slots(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`expert_slots` as one product pair an expert on its tokens (the counts read on the host)."""
        T, k = ids.shape
        flat = ids.reshape(-1) - self.first
        n_local = self.gate_up.shape[0]
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat.clamp(-1, n_local).add(1), minlength=n_local + 2).tolist()
        out = x.new_zeros(T * k, x.shape[1])
        at = counts[0]  # slots of experts before this slice
        for e in range(n_local):
            n = counts[e + 1]
            if n == 0:
                continue
            idx = order[at : at + n]
            h = x.index_select(0, idx // k)
            gate, up = F.linear(h, self.gate_up[e]).chunk(2, dim=-1)
            out.index_copy_(0, idx, F.linear(F.silu(gate) * up, self.down[e]))
            at += n
        return out.view(T, k, -1)

    def grouped_slots(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`expert_slots` as two grouped products over the slots sorted by expert: shapes follow
        ``T * k`` only and nothing is read on the host (the expert counts stay on the device)."""
        T, k = ids.shape
        n_local = self.gate_up.shape[0]
        flat = ids.reshape(-1) - self.first
        key = torch.where((flat >= 0) & (flat < n_local), flat, n_local)  # other slices' slots sort last
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(n_local + 1, dtype=torch.int32, device=x.device)
        counts.index_add_(0, key, torch.ones_like(key, dtype=torch.int32))
        ends = torch.cumsum(counts[:n_local], 0, dtype=torch.int32)
        h = x.index_select(0, order // k)
        gate, up = torch._grouped_mm(h, self.gate_up.transpose(1, 2), offs=ends).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.down.transpose(1, 2), offs=ends)
        mine = torch.arange(T * k, device=x.device) < ends[-1]  # rows past the last group: not this slice's
        y = torch.where(mine[:, None], y, torch.zeros((), dtype=y.dtype, device=y.device))
        return torch.zeros_like(y).index_copy_(0, order, y).view(T, k, -1)


def grouped_ok(moe: RoutedExperts) -> bool:
    """Whether ``torch._grouped_mm`` runs this layer's experts on their device and dtype (it needs
    16-byte-aligned strides and, on CUDA, a recent GPU) and agrees with the per-expert products on a few
    tokens."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(5, moe.gate_up.shape[2], generator=gen).to(moe.gate_up.device, moe.gate_up.dtype)
    ids = torch.arange(5 * moe.top_k).remainder(moe.gate_up.shape[0]).view(5, -1).to(x.device) + moe.first
    try:
        with torch.inference_mode():
            want, got = moe.looped_slots(x, ids), moe.grouped_slots(x, ids)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    scale = float(want.abs().max()) + 1e-6
    return bool((got - want).abs().max() <= 1e-2 * scale)


def routed_experts_of(mlp: torch.nn.Module) -> RoutedExperts | None:
    """The :class:`RoutedExperts` view of a native mixture-of-experts MLP module whose router is a plain
    softmax top-k (``gate.weight``, ``gate.top_k``, ``gate.norm_topk_prob``) over stacked SwiGLU experts
    (``experts.gate_up_proj``, ``experts.down_proj``) with no shared expert and no router bias; None for
    any other MLP (it then runs as its module). The weights are the module's own (no copy). A module that
    holds a slice of the experts (a tensor-parallel rank's) says the id of its first as ``first``."""
    gate, experts = getattr(mlp, "gate", None), getattr(mlp, "experts", None)
    if gate is None or experts is None or hasattr(mlp, "shared_experts") or hasattr(mlp, "shared_expert"):
        return None
    if not all(hasattr(gate, a) for a in ("weight", "top_k", "norm_topk_prob")):
        return None
    if hasattr(gate, "e_score_correction_bias") or not isinstance(gate.weight, torch.Tensor):
        return None
    if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")):
        return None
    act = type(getattr(experts, "act_fn", None))
    if not (issubclass(act, torch.nn.SiLU) or act.__name__ == "SiLUActivation"):
        return None
    moe = RoutedExperts(
        router=gate.weight.detach(),
        gate_up=experts.gate_up_proj.detach(),
        down=experts.down_proj.detach(),
        top_k=int(gate.top_k),
        normalize=bool(gate.norm_topk_prob),
        first=int(getattr(mlp, "first", 0)),
    )
    moe.grouped = grouped_ok(moe)
    return moe

"""A lean batched forward for Qwen2/Qwen3/Glm4-MoE-style decoders (every family here).

Decoding calls the model many times on a handful of tokens per row, where transformers' generic forward
spends more time in Python (mask preparation, cache concatenation, output objects) than in arithmetic,
and cannot give each row of a batch its own cached length. This path reuses the native module's own
weights and sub-modules (norms, MLP or mixture of experts, rotary embedding) and only replaces the
attention plumbing:

* keys/values live in a :class:`~s2d2.adapters.kv_pool.KVPool` with a row dimension; each row writes its
  new keys at its own length and attends to its own slot;
* the tokens of all rows are packed into one sequence for the projections and MLPs; attention pads them
  to the longest segment, and the float mask ``[rows, 1, queries, keys]`` carries each row's own
  visibility (its cache, its segment's mask, nothing of the padding).

It computes the same function as the native forward (the golden tests run both paths).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .kv_pool import KVPool
from .segment import Segment


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first ``cos.shape[-1]`` dims of each head (partial rotary passes the rest)."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def batch_mask(
    segments: Sequence[Segment], rows: Sequence[int], n_rows: int, n_q: int, n_k: int
) -> torch.Tensor:
    """Float attention mask ``[n_rows, 1, n_q, n_k]`` (0 = visible, -inf = hidden) of a padded batch.

    Segment i occupies attention row ``rows[i]``: its valid queries see its cached keys ``[0, length)``
    and its own new keys as its ``mask`` allows. Padding queries and rows without a segment see key 0
    only (finite output, never read).
    """
    out = torch.full((n_rows, 1, n_q, n_k), float("-inf"))
    out[:, 0, :, 0] = 0.0
    for r, seg in zip(rows, segments, strict=True):
        ctx, n = seg.state.length, seg.n
        out[r, 0, :n, 0] = float("-inf")
        out[r, 0, :n, :ctx] = seg.context_bias
        inner = torch.zeros(n, n) if seg.bias is None else seg.bias.float()
        out[r, 0, :n, ctx : ctx + n] = inner.masked_fill(~seg.mask, float("-inf"))
    return out


class FastDecoder:
    """Batched forward of a native ``Qwen2/Qwen3/Glm4Moe ForCausalLM`` against a :class:`KVPool`."""

    SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Glm4MoeForCausalLM")

    def __init__(self, model: torch.nn.Module):
        self.model = model
        cfg = model.config
        self.layers = list(model.model.layers)
        self.embed = model.model.embed_tokens
        self.norm = model.model.norm
        self.lm_head = model.lm_head
        self.rotary = model.model.rotary_emb
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        attn = self.layers[0].self_attn
        self.qk_norm = hasattr(attn, "q_norm") and getattr(attn, "use_qk_norm", True)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        #: on the CPU, explicit attention and fused RMSNorm beat the generic kernels at these sizes
        self.cpu_kernels = self.device.type == "cpu" and self.dtype == torch.float32

    def _norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The native RMSNorm (``weight * x / rms(x)``), fused on the CPU in float32."""
        if self.cpu_kernels:
            return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
        return module(x)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention ``[rows, heads, n_q, hd]`` over ``[rows, kv_heads, n_k, hd]`` with a float mask."""
        if not self.cpu_kernels:
            gqa = self.n_kv != self.n_heads
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(mask)
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    @classmethod
    def supports(cls, model: torch.nn.Module) -> bool:
        cfg = model.config
        sliding = any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or []))
        return type(model).__name__ in cls.SUPPORTED and not sliding

    def new_pool(self, rows: int = 1, tokens: int = 256) -> KVPool:
        return KVPool(
            len(self.layers),
            self.n_kv,
            self.head_dim,
            dtype=self.dtype,
            device=self.device,
            rows=rows,
            tokens=tokens,
        )

    @torch.inference_mode()
    def forward(self, pool: KVPool, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Run every segment in one forward; return each one's raw logits ``[len(logit_rows), vocab]``.

        Tokens of all rows are packed into one ``[T, hidden]`` sequence for the projections and MLPs (no
        padding work); only attention pads them to ``[rows, heads, n_q, head_dim]``. Each segment's new
        keys/values are written at its row's cached length; lengths are not advanced here.
        """
        R = len(segments)
        n_q = max(s.n for s in segments)
        n_k = max(s.state.length + s.n for s in segments)
        slots = [s.state.slot for s in segments]
        pool.ensure(max(slots) + 1, n_k)
        dev = self.device
        offsets = torch.tensor([0] + [s.n for s in segments]).cumsum(0)
        ids = torch.cat([s.ids for s in segments]).to(dev)
        pos = torch.cat([s.pos for s in segments]).to(dev)
        r_idx = torch.repeat_interleave(torch.arange(R), torch.tensor([s.n for s in segments])).to(dev)
        j_idx = torch.cat([torch.arange(s.n) for s in segments]).to(dev)
        lengths = torch.tensor([s.state.length for s in segments], device=dev)
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        write_slot, write_col = slot_t[r_idx], lengths[r_idx] + j_idx
        # Attention rows: the pool's own slots when they are dense enough (keys/values read in place, no
        # copy), else the segments gathered in order.
        in_place = max(slots) + 1 <= 2 * R
        n_rows = max(slots) + 1 if in_place else R
        rows = slots if in_place else list(range(R))
        att_row = write_slot if in_place else r_idx
        mask = batch_mask(segments, rows, n_rows, n_q, n_k).to(device=dev, dtype=self.dtype)
        x = self.embed(ids[None])  # [1, T, hidden]
        cos, sin = self.rotary(x, pos[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [T, 1, rot]
        T, hd, H = ids.numel(), self.head_dim, self.n_heads
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = self._norm(layer.input_layernorm, x)
            q = attn.q_proj(h).view(T, H, hd)
            k = attn.k_proj(h).view(T, self.n_kv, hd)
            v = attn.v_proj(h).view(T, self.n_kv, hd)
            if self.qk_norm:
                q, k = self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            pk, pv = pool.k[i], pool.v[i]
            pk[write_slot, :, write_col] = k
            pv[write_slot, :, write_col] = v
            if in_place:
                keys, values = pk[:n_rows, :, :n_k], pv[:n_rows, :, :n_k]
            else:
                keys, values = pk[:, :, :n_k].index_select(0, slot_t), pv[:, :, :n_k].index_select(0, slot_t)
            q_pad = q.new_zeros(n_rows, n_q, H, hd)
            q_pad[att_row, j_idx] = q
            o = self._attend(q_pad.transpose(1, 2), keys, values, mask, attn.scaling)
            o = o.transpose(1, 2)[att_row, j_idx].reshape(1, T, H * hd)
            x = x + attn.o_proj(o)
            x = x + layer.mlp(self._norm(layer.post_attention_layernorm, x))
        flat = torch.cat([offsets[r] + s.logit_rows for r, s in enumerate(segments)])
        sizes = [s.logit_rows.numel() for s in segments]
        if flat.numel() == 0:
            empty = x.new_zeros(0, self.lm_head.out_features, dtype=torch.float32)
            return [empty for _ in segments]
        chosen = x[0].index_select(0, flat.to(dev))
        logits = self.lm_head(self._norm(self.norm, chosen)).float()
        return list(logits.split(sizes))

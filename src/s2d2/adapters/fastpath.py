"""A lean forward for Qwen2/Qwen3-style decoders (SDAR, Fast-dLLM v2, the built-in tiny-gsm).

Decoding calls the model many times on a handful of tokens, where transformers' generic forward spends
more time in Python (mask preparation, cache concatenation, output objects) than in arithmetic. This
path reuses the native module's own weights and sub-modules (norms, MLP, rotary embedding) and only
replaces the attention plumbing:

* keys/values live in preallocated per-layer buffers that grow by doubling; "cropping" a read-only
  forward just does not advance the length, so nothing is copied or concatenated;
* the boolean ``[q, k]`` mask of the adapter protocol goes straight to ``scaled_dot_product_attention``.

It computes the same function as the native forward (the golden tests run both paths).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GrowingKV:
    """Per-layer key/value buffers ``[1, kv_heads, capacity, head_dim]`` that grow on demand."""

    def __init__(
        self,
        n_layers: int,
        n_kv: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        capacity: int = 256,
    ):
        self.shape = (n_layers, n_kv, head_dim)
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.ensure(capacity)

    def ensure(self, n: int) -> None:
        if n <= self.capacity:
            return
        cap = max(n, 2 * self.capacity)
        n_layers, n_kv, hd = self.shape

        def grow(old: list[torch.Tensor]) -> list[torch.Tensor]:
            new = [
                torch.empty(1, n_kv, cap, hd, dtype=self.dtype, device=self.device) for _ in range(n_layers)
            ]
            for dst, src in zip(new, old, strict=False):
                dst[:, :, : self.capacity] = src
            return new

        self.k, self.v = grow(self.k), grow(self.v)
        self.capacity = cap


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastQwen:
    """Forward of a native ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` against a :class:`GrowingKV`."""

    SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")

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
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device

    @classmethod
    def supports(cls, model: torch.nn.Module) -> bool:
        cfg = model.config
        sliding = any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or []))
        return type(model).__name__ in cls.SUPPORTED and not sliding

    def new_cache(self) -> GrowingKV:
        return GrowingKV(len(self.layers), self.n_kv, self.head_dim, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def forward(
        self,
        cache: GrowingKV,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        *,
        start: int,
        n_logits: int,
    ) -> torch.Tensor:
        """Run ``ids`` (written at cache rows ``start...``) with boolean ``mask`` ``[n, start + n]``;
        return the last ``n_logits`` rows of logits (float32)."""
        n = ids.numel()
        end = start + n
        cache.ensure(end)
        x = self.embed(ids.view(1, n).to(self.device))
        cos, sin = self.rotary(x, pos.view(1, n).to(self.device))
        cos, sin = cos[:, None], sin[:, None]
        attn_mask = mask.to(self.device)[None, None]
        gqa = self.n_kv != self.n_heads
        hd = self.head_dim
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, n, self.n_heads, hd)
            k = attn.k_proj(h).view(1, n, self.n_kv, hd)
            v = attn.v_proj(h).view(1, n, self.n_kv, hd).transpose(1, 2)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.k[i][:, :, start:end] = k
            cache.v[i][:, :, start:end] = v
            o = F.scaled_dot_product_attention(
                q,
                cache.k[i][:, :, :end],
                cache.v[i][:, :, :end],
                attn_mask=attn_mask,
                scale=attn.scaling,
                enable_gqa=gqa,
            )
            x = x + attn.o_proj(o.transpose(1, 2).reshape(1, n, self.n_heads * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if n_logits == 0:
            return x.new_zeros(0, self.lm_head.out_features, dtype=torch.float32)
        return self.lm_head(self.norm(x[0, n - n_logits :])).float()

"""The forward of a :class:`~s2d2.forward.forward_batch.ForwardBatch`: few ops a layer, one attention.

Per layer, for all rows and every segment kind together (about 20 kernel-launching ops on the CPU):
RMSNorm; one fused q/k/v projection; q/k-norm (one normalisation of every q and k head, one weight
multiply); RoPE of q and k as one batched matmul by each token's rotation (built once a forward); the
new keys and values written to their pool slots (write before attend); ONE attention call: each row's
queries gathered into a padded grid (GQA heads folded into the query axis), its pages gathered from the
pool, and one masked attention over all rows with the mask built on the device from the batch's
integer visibility, once a forward; the output scattered back to packed order and projected with the
residual added in the same op; RMSNorm; one fused gate/up projection, SiLU times the gate, the down
projection with the residual. On CUDA the norms, q/k-norm with RoPE and SiLU times the gate are
small compiled functions (:mod:`~s2d2.forward.small_ops`, a kernel or two each). Fused weights are made
once (the modules' own weights become views of them, so memory does not grow). A softmax top-k mixture of
experts runs as :class:`~s2d2.forward.routed_experts.RoutedExperts`; any other mixture of experts runs as
its module.

The body takes no host syncs and branches on no data (shapes only), so it compiles whole
(``torch.compile(fullgraph=True)``) and a CUDA graph can capture it per padded token count, except where a
mixture of experts reads its routing's counts on the host (its module, or routed experts run one expert
at a time): such a model runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .forward_batch import ForwardBatch
from .routed_experts import RoutedExperts, routed_experts_of
from .span_attention import span_attention


def _fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight ``[sum out, in]`` (and bias) for ``linears``; their own parameters become views of it."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    if any(b is not None for b in biases) and bias is None:
        raise ValueError("mixed biases")
    at = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = weight[at : at + n]
        if bias is not None:
            lin.bias.data = bias[at : at + n]
        at += n
    return weight, bias


@dataclass
class LayerWeights:
    """A layer's fused weights: ``qkv`` ``[(H + 2 kv) hd, hidden]`` (+ bias), ``qk_norm`` ``[H + kv, hd]``
    (None: no q/k-norm), ``gate_up`` ``[2 I, hidden]`` (None: a mixture of experts, ``moe`` where it is a
    softmax top-k one, else the MLP runs as its module)."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None
    qk_eps: float
    gate_up: torch.Tensor | None
    inter: int
    moe: RoutedExperts | None = None


def layer_weights(layer: torch.nn.Module, n_heads: int, n_kv: int, qk_norm: bool) -> LayerWeights:
    attn = layer.self_attn
    qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
    norm, eps = None, 0.0
    if qk_norm:
        norm = torch.cat([attn.q_norm.weight.detach()[None].expand(n_heads, -1),
                          attn.k_norm.weight.detach()[None].expand(n_kv, -1)])  # fmt: skip
        eps = float(attn.q_norm.variance_epsilon)
    mlp, gate_up, inter = layer.mlp, None, 0
    plain = all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    act = type(getattr(mlp, "act_fn", None))
    silu = issubclass(act, torch.nn.SiLU) or act.__name__ == "SiLUActivation"
    if plain and silu and mlp.gate_proj.bias is None and mlp.up_proj.bias is None:
        gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
        inter = mlp.gate_proj.weight.shape[0]
    moe = None if gate_up is not None else routed_experts_of(mlp)
    return LayerWeights(qkv, qkv_bias, norm, eps, gate_up, inter, moe)


def rotations(cos: torch.Tensor, sin: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Each token's RoPE as a matrix ``[T, hd, hd]`` (``x @ M[t]`` = ``x * cos + rotate_half(x) * sin`` on
    the first ``rd`` dims, the rest passed through) from ``cos``/``sin`` ``[T, rd]`` and
    :func:`rotate_half_matrix` ``signs``."""
    T, rd = cos.shape
    head_dim = signs.shape[0]
    if rd < head_dim:
        cos = torch.cat([cos, cos.new_ones(T, head_dim - rd)], dim=1)
        sin = torch.cat([sin, sin.new_zeros(T, head_dim - rd)], dim=1)
    return torch.diag_embed(cos) + sin[:, None, :] * signs


def rotate_half_matrix(
    head_dim: int, rotary_dim: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``[hd, hd]``: ``x @ S`` is ``rotate_half`` of the first ``rotary_dim`` dims (zeros past them)."""
    half = rotary_dim // 2
    sign = np.zeros((head_dim, head_dim), dtype=np.float32)
    idx = np.arange(half)
    sign[idx + half, idx] = -1.0  # out[d] = -x[d + half], d < half
    sign[idx, idx + half] = 1.0  # out[d + half] = x[d]
    return torch.from_numpy(sign).to(device=device, dtype=dtype)


def span_mask(b: ForwardBatch, n_kv: int, rep: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``[kv * rows, rep * n_q, n_k]`` (0 visible, -inf hidden) of batch ``b`` (device
    fields), built on the device from its integer visibility (once a forward, shared by every layer)."""
    k = torch.arange(b.n_k, device=b.hi.device)
    hi, lo, whi, me = (t[:, None] for t in (b.hi, b.win_lo, b.win_hi, b.self_key))
    seen = (k < hi) | ((k >= lo) & (k < whi)) | (k == me)
    zero = torch.zeros((), dtype=dtype, device=k.device)
    mask = torch.where(seen, zero, float("-inf")).view(1, b.rows, 1, b.n_q, b.n_k)
    return mask.expand(n_kv, b.rows, rep, b.n_q, b.n_k).reshape(n_kv * b.rows, rep * b.n_q, b.n_k)


def layer_forward(
    dec, i: int, layer: torch.nn.Module, w: LayerWeights, x: torch.Tensor,
    rot: torch.Tensor | tuple[torch.Tensor, torch.Tensor], b: ForwardBatch, mask: torch.Tensor, pool,
) -> torch.Tensor:  # fmt: skip
    """One decoder layer on the packed hidden states ``x`` ``[T, hidden]`` (see the module docstring);
    ``dec`` is the :class:`~s2d2.forward.fastpath.FastDecoder` (its sizes, norms and small ops). ``rot``:
    each token's rotation :func:`rotations` ``[T, hd, hd]``, or ``(cos, sin)`` ``[T, 1, rd]`` where the
    decoder's compiled small ops (``dec.small``) apply q/k-norm and RoPE together."""
    attn = layer.self_attn
    T, H, kv, hd = b.tokens, dec.n_heads, dec.n_kv, dec.head_dim
    rep = H // kv
    h = dec._norm(layer.input_layernorm, x)
    qkv = F.linear(h, w.qkv, w.qkv_bias).view(T, H + 2 * kv, hd)
    qk = qkv[:, : H + kv]
    if isinstance(rot, tuple):  # compiled: q/k-norm and RoPE as one kernel
        qk = dec.small.qk_norm_rope(qk, w.qk_norm, w.qk_eps, *rot)
    else:
        if w.qk_norm is not None:
            if dec.cpu_kernels:
                qk = F.rms_norm(qk, (hd,), None, w.qk_eps) * w.qk_norm
            else:
                qk = torch.cat([attn.q_norm(qk[:, :H]), attn.k_norm(qk[:, H:])], dim=1)
        qk = torch.bmm(qk, rot)  # RoPE: [T, H + kv, hd]
    pool.k[i].view(kv, -1, hd).index_copy_(1, b.slot, qk[:, H:].transpose(0, 1))
    pool.v[i].view(kv, -1, hd).index_copy_(1, b.slot, qkv[:, H + kv :].transpose(0, 1))
    if dec.attention == "triton":  # the paged kernel: pages read in place, the mask from the integers
        o = span_attention(qk[:, :H], pool.k[i], pool.v[i], b, attn.scaling).view(T, H * hd)
        return _rest(dec, layer, w, x, o)
    q = qk.reshape(T * (H + kv), hd).index_select(0, b.q_gather).view(kv * b.rows, rep * b.n_q, hd)
    keys = pool.k[i].index_select(1, b.pages).view(kv * b.rows, b.n_k, hd)
    values = pool.v[i].index_select(1, b.pages).view(kv * b.rows, b.n_k, hd)
    if dec.attention == "cpu":
        scores = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=attn.scaling)
        o = torch.bmm(torch.softmax(scores, dim=-1), values)
    else:
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
    o = o.reshape(-1, hd).index_select(0, b.out_gather).view(T, H * hd)
    return _rest(dec, layer, w, x, o)


def _rest(dec, layer: torch.nn.Module, w: LayerWeights, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The layer after attention: output projection with the residual, RMSNorm, the MLP with the
    residual."""
    tp = dec.tp
    x = tp.add_row_parallel(x, o, layer.self_attn.o_proj)
    h = dec._norm(layer.post_attention_layernorm, x)
    if w.moe is not None:  # several ranks: this rank's slice of the routed experts (routed over all)
        return x + tp.reduce(w.moe.forward(h))
    if w.gate_up is None:
        return x + tp.reduce(layer.mlp(h))
    return tp.add_row_parallel(x, _gated(dec, w, h), layer.mlp.down_proj)


def _gated(dec, w: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """SiLU of the gate times the up projection ``[T, inter]`` (one fused gate/up matmul)."""
    gu = F.linear(h, w.gate_up)
    if dec.small is not None:
        return dec.small.silu_mul(gu, w.inter)
    return F.silu(gu[:, : w.inter]).mul_(gu[:, w.inter :])

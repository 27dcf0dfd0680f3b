"""The paged forward's small element-wise ops as few kernels on CUDA: RMSNorm, q/k-norm with RoPE, SiLU
times the gate, each a small function ``torch.compile`` fuses into one or two kernels (as nano-vllm does).

Each function computes what the native modules compute, in the same order and precision (the norm in
float32, rounded to the model's dtype before the weight multiplies; RoPE on the first ``rd`` dims of
each head, the rest passed through), so the compiled versions match the eager forward up to float
reassociation. :class:`SmallOps` holds them compiled (CUDA with Triton, not ``enforce_eager``) or as
they are (any device: the tests compare both on the CPU, where the forward keeps its own fused CPU
kernels). The functions take and return tensors only and branch on shapes alone, so a CUDA graph
captures them and the forward body still compiles whole.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen-style RMSNorm of the last dim: ``weight * (x / rms(x))`` computed in float32, rounded to
    ``x``'s dtype before the weight multiplies. ``x`` ``[..., d]``, ``weight`` broadcastable to it."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[T, heads, hd]`` by ``cos``/``sin`` ``[T, 1, rd]`` on the first ``rd``
    dims of each head (``x * cos + rotate_half(x) * sin``); dims past ``rd`` pass through."""
    rd, half = cos.shape[-1], cos.shape[-1] // 2
    rot = x[..., :rd]
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos + turned * sin
    return out if rd == x.shape[-1] else torch.cat([out, x[..., rd:]], dim=-1)


def qk_norm_rope(
    qk: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """q/k-norm (``weight`` ``[heads, hd]``, one row a q or k head; None: no norm) then RoPE of the
    packed q and k heads ``qk`` ``[T, H + kv, hd]``."""
    if weight is not None:
        qk = rms_norm(qk, weight, eps)
    return rope(qk, cos, sin)


def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """``silu(gate) * up`` of the fused gate/up projection ``[T, 2 * inter]`` (gate first)."""
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


class SmallOps:
    """:func:`rms_norm`, :func:`qk_norm_rope` and :func:`silu_mul`, compiled with ``backend`` (None: as
    they are). Compilation happens at each function's first call (and again for a new shape class)."""

    def __init__(self, backend: str | None = "inductor"):
        self.backend = backend
        wrap: Callable[[Callable], Callable] = (
            (lambda f: f) if backend is None else (lambda f: torch.compile(f, backend=backend, dynamic=True))
        )
        self.rms_norm = wrap(rms_norm)
        self.qk_norm_rope = wrap(qk_norm_rope)
        self.silu_mul = wrap(silu_mul)


def small_ops_for(device: torch.device, enforce_eager: bool, compiler_ready: bool) -> SmallOps | None:
    """The compiled small ops the paged forward uses on CUDA (``compiler_ready``: Triton imports), or
    None (the CPU, ``enforce_eager``, no compiler: the eager ops)."""
    if device.type != "cuda" or enforce_eager or not compiler_ready:
        return None
    return SmallOps("inductor")

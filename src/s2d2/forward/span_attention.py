"""Span attention: every query of a packed batch against its row's paged keys, masked by integers.

The CUDA attention of the paged forward, one call a layer for all rows and segment kinds: a Triton
kernel that reads the key/value pool in place through each row's page table (any page size) and
evaluates each query's visibility from its :class:`~s2d2.forward.forward_batch.ForwardBatch` integers
(keys ``[0, hi)``, ``[win_lo, win_hi)`` and ``self_key``) in registers, with an online softmax. The grid
is fixed by the padded token count and the heads, and there is no host-side plan, so a CUDA graph
captures it. The kernel runs one program per (query token, head) and loops over ``BLOCK_N`` keys at a
time up to the query's last visible key; grouped-query heads read their key/value head.

Triton is an optional dependency (the ``gpu`` extra); under ``TRITON_INTERPRET=1`` the kernel runs on
the CPU, where the tests compare it with :func:`span_attention_reference` (dense mask, SDPA).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    """The Triton kernel (its module is imported at first use: Triton reads ``TRITON_INTERPRET`` when a
    kernel is defined)."""
    from .span_attention_kernel import span_attention_kernel

    return span_attention_kernel


def triton_available() -> bool:
    """Whether Triton can be imported (the ``gpu`` extra)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def span_attention(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, b: Any, scale: float, block_n: int = 16
) -> torch.Tensor:
    """Attention output ``[T, H, hd]`` of queries ``q`` ``[T, H, hd]`` (any token/head strides, last dim
    contiguous) over the head-major pools ``[kv, pages, page_size, hd]`` of one layer, for the device
    :class:`~s2d2.forward.forward_batch.ForwardBatch` ``b``. ``hd`` must be a power of two."""
    T, H, hd = q.shape
    kv, _, ps, _ = k_pages.shape
    out = torch.empty(T, H, hd, dtype=q.dtype, device=q.device)
    _kernel()[(T, H)](
        q, k_pages, v_pages, out, b.pages, b.out_index, b.hi, b.win_lo, b.win_hi, b.self_key,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        out.stride(0), out.stride(1), b.n_q, b.width, float(scale),
        H=H, REP=H // kv, HD=hd, PS=ps, BLOCK_N=block_n,
    )  # fmt: skip
    return out


def span_attention_reference(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, b: Any, scale: float
) -> torch.Tensor:
    """:func:`span_attention` in plain torch, one query at a time (the tests' oracle)."""
    T, H, hd = q.shape
    kv, _, ps, _ = k_pages.shape
    pages = b.pages.view(b.rows, b.width)
    out = torch.zeros(T, H, hd, dtype=torch.float32)
    for t in range(T):
        g = int(b.out_index[t])
        row = g // b.n_q
        keys = torch.arange(b.n_k)
        seen = (keys < b.hi[g]) | ((keys >= b.win_lo[g]) & (keys < b.win_hi[g])) | (keys == b.self_key[g])
        k = k_pages[:, pages[row]].reshape(kv, b.n_k, hd).float()
        v = v_pages[:, pages[row]].reshape(kv, b.n_k, hd).float()
        for h in range(H):
            s = (k[h // (H // kv)] @ q[t, h].float()) * scale
            p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=0)
            out[t, h] = p @ v[h // (H // kv)]
    return out.to(q.dtype)


def self_check(
    n_heads: int, n_kv: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> str | None:
    """Run the kernel once on a small random batch of this model's head shape and compare it with
    :func:`span_attention_reference`: None when it agrees, else why not (the caller then uses SDPA)."""
    from ..layouts.mask_spec import spec_of
    from .forward_batch import build_batch

    try:
        gen = torch.Generator().manual_seed(0)
        k_pages = torch.randn(n_kv, 6, 16, head_dim, generator=gen).to(device=device, dtype=dtype)
        v_pages = torch.randn(n_kv, 6, 16, head_dim, generator=gen).to(device=device, dtype=dtype)
        sizes = (3, 2)
        specs = [spec_of(torch.ones(n, n, dtype=torch.bool).tril()) for n in sizes]
        b = build_batch([20, 5], [[1] * n for n in sizes], [[0] * n for n in sizes], specs, [[2, 4], [5]],
                        [torch.arange(n) for n in sizes], 16, n_heads, n_kv)  # fmt: skip
        q = torch.randn(b.tokens, n_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
        got = span_attention(q, k_pages, v_pages, b.to(device), 0.1).float().cpu()
        want = span_attention_reference(q.cpu(), k_pages.cpu(), v_pages.cpu(), b.to("cpu"), 0.1).float()
    except Exception as exc:  # a kernel that does not build or launch here: report, do not fail the load
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    err = float((got - want).abs().max())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return None if err <= tol else f"the kernel differs from the reference by {err:.3g}"

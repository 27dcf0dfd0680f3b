"""The Triton kernel of :mod:`s2d2.forward.span_attention` (imported at first use: Triton is optional,
and it reads ``TRITON_INTERPRET`` when the kernel is defined)."""

import triton
import triton.language as tl


@triton.jit
def span_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, pages_ptr, grid_ptr, hi_ptr, lo_ptr, whi_ptr, self_ptr,
    stride_qt, stride_qh, stride_kh, stride_kp, stride_ks, stride_ot, stride_oh,
    n_q, width, scale,
    H: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, PS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    h = tl.program_id(1)
    g = tl.load(grid_ptr + t)
    row = g // n_q
    hi = tl.load(hi_ptr + g)
    lo = tl.load(lo_ptr + g)
    whi = tl.load(whi_ptr + g)
    me = tl.load(self_ptr + g)
    end = tl.maximum(tl.maximum(hi, whi), me + 1)
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d).to(tl.float32)
    kvh = h // REP
    m_i = tl.zeros([1], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([HD], dtype=tl.float32)
    for start in range(0, end, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        inside = key < end
        page = tl.load(pages_ptr + row * width + key // PS, mask=inside, other=0)
        at = kvh * stride_kh + page * stride_kp + (key % PS) * stride_ks
        k = tl.load(k_ptr + at[:, None] + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        seen = (key < hi) | ((key >= lo) & (key < whi)) | (key == me)
        s = tl.where(seen & inside, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_use = tl.maximum(m_new, -1e30)  # a block with no visible key: exp(-inf) = 0, not NaN
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use)
        v = tl.load(v_ptr + at[:, None] + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(o_ptr + t * stride_ot + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))

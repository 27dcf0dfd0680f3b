"""The forward's small ops as compiled on CUDA, checked on the CPU: each function equals the native module
(RMSNorm) or the CPU path's math (q/k-norm with RoPE, SiLU times the gate); compiled (``aot_eager``) they
equal themselves eager; the paged forward with them gives the eager forward's logits and the same tokens,
and its body still compiles whole; the CPU and ``enforce_eager`` keep the eager ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_graph_runner import _batch, _rows, compiles_whole

import s2d2
from s2d2.bench.suites import load_problems
from s2d2.forward import small_ops
from s2d2.forward.paged_forward import rotate_half_matrix, rotations
from s2d2.forward.small_ops import SmallOps, small_ops_for


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False, device="cpu")


@pytest.fixture
def with_small_ops(tiny):
    """The tiny model's decoder running the small ops (compiled with ``backend``), as on CUDA."""
    fast = tiny.adapter.fast

    def use(backend):
        fast.small, fast.cpu_kernels = SmallOps(backend), False
        return fast

    yield use
    fast.small, fast.cpu_kernels = None, True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_native_module(tiny, dtype):
    module = tiny.adapter.fast.layers[0].input_layernorm
    x = torch.randn(7, module.weight.shape[0], generator=torch.Generator().manual_seed(0))
    weight = module.weight.detach().to(dtype)
    native = type(module)(weight.shape[0], eps=module.variance_epsilon).to(dtype)
    native.weight.data.copy_(weight)
    assert torch.equal(small_ops.rms_norm(x.to(dtype), weight, module.variance_epsilon), native(x.to(dtype)))


@pytest.mark.parametrize("rd", [16, 8])  # full and partial rotary
def test_qk_norm_rope_is_the_cpu_paths_norm_and_rotation(rd):
    gen = torch.Generator().manual_seed(1)
    T, heads, hd = 5, 6, 16
    qk, w = torch.randn(T, heads, hd, generator=gen), torch.randn(heads, hd, generator=gen)
    angles = torch.randn(T, rd // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    rot = rotations(cos, sin, rotate_half_matrix(hd, rd, qk.dtype, "cpu"))
    want = torch.bmm(F.rms_norm(qk, (hd,), None, 1e-6) * w, rot)
    got = small_ops.qk_norm_rope(qk, w, 1e-6, cos[:, None], sin[:, None])
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, F.rms_norm(qk, (hd,), None, 1e-6) * w, atol=1e-2)  # it does rotate


def test_compiled_small_ops_equal_the_eager_ones():
    gen = torch.Generator().manual_seed(2)
    eager, compiled = SmallOps(None), SmallOps("aot_eager")
    x, w = torch.randn(9, 32, generator=gen), torch.randn(32, generator=gen)
    qk, hw = torch.randn(9, 6, 16, generator=gen), torch.randn(6, 16, generator=gen)
    cos, sin = torch.randn(9, 1, 16, generator=gen), torch.randn(9, 1, 16, generator=gen)
    gu = torch.randn(9, 64, generator=gen)
    for n in (9, 4):  # two shapes: the second runs the dynamic-shape graph
        assert torch.equal(compiled.rms_norm(x[:n], w, 1e-6), eager.rms_norm(x[:n], w, 1e-6))
        args = (qk[:n], hw, 1e-6, cos[:n], sin[:n])
        assert torch.equal(compiled.qk_norm_rope(*args), eager.qk_norm_rope(*args))
        assert torch.equal(compiled.silu_mul(gu[:n], 32), eager.silu_mul(gu[:n], 32))
        assert torch.equal(eager.silu_mul(gu[:n], 32), F.silu(gu[:n, :32]) * gu[:n, 32:])


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_the_forward_with_small_ops_gives_the_eager_logits(tiny, with_small_ops, backend):
    fast = tiny.adapter.fast
    pool, states = _rows(fast)
    sizes = (3, 5, 1)
    with torch.no_grad():
        eager = fast.run_batch(pool, _batch(fast, pool, states, sizes, 0).to("cpu"))
        with_small_ops(backend)
        got = fast.run_batch(pool, _batch(fast, pool, states, sizes, 0).to("cpu"))
    assert torch.allclose(got, eager, atol=1e-4), (got - eager).abs().max()


def test_the_body_with_small_ops_compiles_whole(tiny, with_small_ops):
    compiles_whole(with_small_ops("aot_eager"))


def test_a_generation_with_small_ops_gives_the_eager_tokens(tiny, with_small_ops):
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 6)]
    cfg = tiny.make_config(preset="lossless", block_size=8, max_new_tokens=24)
    tiny.max_num_seqs, tiny._engine = 3, None
    eager = [r.token_ids for r in tiny.generate_batch(prompts, cfg)]
    with_small_ops("aot_eager")
    tiny._engine = None
    assert [r.token_ids for r in tiny.generate_batch(prompts, cfg)] == eager


def test_small_ops_are_compiled_on_cuda_only_and_not_under_enforce_eager():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert isinstance(small_ops_for(cuda, False, True), SmallOps)
    assert small_ops_for(cuda, True, True) is None  # enforce_eager
    assert small_ops_for(cuda, False, False) is None  # no Triton: no compiler
    assert small_ops_for(cpu, False, True) is None

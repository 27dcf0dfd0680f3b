"""The Triton span-attention kernel (run by Triton's interpreter on the CPU, in a fresh interpreter
process: Triton reads TRITON_INTERPRET at import) equals the torch reference: paged keys read in place
through scattered page tables, prefix/window/self visibility, grouped-query heads, padding queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from s2d2.forward import span_attention as sa
from s2d2.forward.forward_batch import BatchShape, build_batch
from s2d2.layouts.mask_spec import MaskSpec

pytest.importorskip("triton")


def _spec(hi, lo, whi, me):
    t = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return MaskSpec(t(hi), t(lo), t(whi), torch.tensor(me, dtype=torch.bool))


def case(heads: int, kv: int, pad: bool, max_q: int | None = None) -> float:
    """Max |kernel - reference| on three rows of scattered pages (run in the child process)."""
    gen = torch.Generator().manual_seed(0)
    hd, ps, n_pages = 16, 4, 12
    k_pages = torch.randn(kv, n_pages, ps, hd, generator=gen)
    v_pages = torch.randn(kv, n_pages, ps, hd, generator=gen)
    specs = [
        _spec([1, 2, 3], [1, 1, 3], [1, 1, 3], [False, False, False]),  # token-causal
        _spec([0, 0, 0, 2], [0, 0, 0, 2], [1, 2, 3, 4], [False, False, False, False]),  # windows only
        _spec([1, 1], [1, 1], [1, 1], [False, True]),  # the second query: a prefix and itself
    ]
    ids = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    pos = [[5, 6, 7], [0, 1, 2, 3], [9, 10]]
    shape = BatchShape(16, 4, 4, 4, 16) if pad else None
    b = build_batch([5, 0, 9], ids, pos, specs, [[3, 7], [5], [9, 2, 11]],  # scattered pages
                    [torch.arange(len(i)) for i in ids], ps, heads, kv, pad=shape,
                    max_q=max_q).to("cpu")  # fmt: skip
    q = torch.randn(b.tokens, heads, hd, generator=gen)
    got = sa.span_attention(q, k_pages, v_pages, b, 0.3, block_n=4)
    want = sa.span_attention_reference(q, k_pages, v_pages, b, 0.3)
    assert torch.isfinite(got).all()
    return float((got - want).abs().max())


def forward_case() -> float:
    """Max |logits| difference of the tiny model's paged forward with the kernel and with the CPU
    attention, over mixed rows (run in the child process)."""
    from test_mask_spec import mixed_segments

    import s2d2

    fast = s2d2.load("tiny-gsm", use_preset=False, device="cpu").adapter.fast
    pool = fast.new_pool(page_size=16)
    eager = fast.forward(pool, mixed_segments(fast, pool))
    fast.attention = "triton"
    kernel = fast.forward(pool, mixed_segments(fast, pool))
    return max(float((a - b).abs().max()) for a, b in zip(eager, kernel, strict=True))


def test_the_kernel_equals_the_reference_under_the_interpreter():
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]; import test_span_attention as t; "
        "print([t.case(h, kv, pad, q) for h, kv, pad, q in ((4, 2, False, None), (2, 2, False, None),"
        " (4, 1, True, None), (4, 2, False, 2))]"
        " + [t.forward_case()])"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}"}
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "tests" / "forward")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(diffs) == 5 and max(diffs[:4]) < 1e-5 and diffs[4] < 1e-4, diffs


def test_the_self_check_passes_on_a_working_kernel_and_reports_a_broken_one(monkeypatch):
    code = (
        "import torch; from s2d2.forward import span_attention as sa; "
        "print(sa.self_check(4, 2, 16, torch.float32, torch.device('cpu')))"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO / 'src'}"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "None", proc.stderr[-2000:]
    monkeypatch.setattr(sa, "span_attention", lambda q, *a: torch.zeros_like(q))
    cpu = torch.device("cpu")
    assert sa.self_check(4, 2, 16, torch.float32, cpu).startswith("the kernel differs")
    monkeypatch.setattr(sa, "span_attention", lambda *a: 1 / 0)
    assert sa.self_check(4, 2, 16, torch.float32, cpu) == "ZeroDivisionError: division by zero"

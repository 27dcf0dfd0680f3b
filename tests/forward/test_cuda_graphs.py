"""On CUDA (skipped elsewhere): a replayed forward gives the eager logits, the Triton span kernel gives
SDPA's, a replayed forward launches at most 5 things on the device, the small ops compiled with
inductor give the eager forward's logits, and an engine's pool gets the common shapes captured at once."""

from __future__ import annotations

import pytest
import torch
from test_mask_spec import mixed_segments

import s2d2
from s2d2.bench.gpu_forward import _launches
from s2d2.forward.graph_runner import load_shapes
from s2d2.forward.small_ops import SmallOps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def fast():
    return s2d2.load("tiny-gsm", use_preset=False, device="cuda", dtype="fp32").adapter.fast


def test_replay_gives_the_eager_logits_and_launches_at_most_5(fast):
    pool = fast.new_pool(page_size=16)
    fast.enforce_eager = True
    eager = fast.forward(pool, mixed_segments(fast, pool))
    fast.enforce_eager = False
    try:
        assert fast.static is not None
        replayed = fast.forward(pool, mixed_segments(fast, pool))  # captures
        again = fast.forward(pool, mixed_segments(fast, pool))  # replays
        launches = _launches(lambda: fast.forward(pool, mixed_segments(fast, pool)), torch.device("cuda"))
    finally:
        fast.enforce_eager = True
    for e, r, a in zip(eager, replayed, again, strict=True):
        assert torch.allclose(e, r, atol=1e-4) and torch.equal(r, a)
    assert launches <= 5, launches


def test_the_span_kernel_gives_sdpa_logits(fast):
    pool = fast.new_pool(page_size=16)
    assert fast.attention == "triton"
    kernel = fast.forward(pool, mixed_segments(fast, pool))
    fast.attention = "sdpa"
    try:
        sdpa = fast.forward(pool, mixed_segments(fast, pool))
    finally:
        fast.attention = "triton"
    for k, s in zip(kernel, sdpa, strict=True):
        assert torch.allclose(k, s, atol=1e-4)


def test_the_compiled_small_ops_give_the_eager_forwards_logits(fast):
    pool = fast.new_pool(page_size=16)
    fast.enforce_eager = True  # no graphs, no compiled small ops
    assert fast.small is None
    eager = fast.forward(pool, mixed_segments(fast, pool))
    fast.small = SmallOps("inductor")
    try:
        compiled = fast.forward(pool, mixed_segments(fast, pool))
    finally:
        fast.small = None
    for e, c in zip(eager, compiled, strict=True):
        assert torch.allclose(e, c, atol=1e-4)


def test_an_engines_pool_captures_the_common_shapes_at_once(fast):
    fast.enforce_eager = False
    try:
        said: list[str] = []
        fast.static.log = said.append
        pool = fast.new_pool(page_size=16, reserve_tokens=4096)  # as the engine makes its pool
        shapes = load_shapes(fast.static.max_tokens)
        assert all(fast.static.entries[s].graph is not None for s in shapes), said
        assert len(said) == 1 and said[0].startswith(f"s2d2: captured CUDA graphs of {len(shapes)} batch")
        replayed = fast.forward(pool, mixed_segments(fast, pool))
    finally:
        fast.enforce_eager = True
    eager = fast.forward(pool, mixed_segments(fast, pool))
    for e, r in zip(eager, replayed, strict=True):
        assert torch.allclose(e, r, atol=1e-4)

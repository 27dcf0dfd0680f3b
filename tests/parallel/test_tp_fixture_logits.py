"""The conformance fixtures' logits over two ranks equal one process's within 1e-4 (SDAR, Fast-dLLM v2,
LLaDA2 with its 8 experts split 4 + 4, SDAR-MoE with its 4 experts split 2 + 2 and a dense layer split
by columns), through the protocol: chained drafts from an empty cache, a prefill (LLaDA2's official one:
its additive float mask, the grouped forward), a draft after it and the AR-mode verification of a filled
block. Each two-rank model starts its second process once and stops it after its family."""

from __future__ import annotations

import pytest
import torch

from conftest import family_fixture
from s2d2.families import load_adapter
from s2d2.families.sharding import kv_heads
from s2d2.parallel import load_parallel

pytestmark = pytest.mark.tensor_parallel

ATOL = 1e-4
PROMPT = [17, 42, 101, 7, 250, 3, 88, 199]
EMPTY = torch.tensor([], dtype=torch.long)


def _logits(adapter) -> list[torch.Tensor]:
    mask = adapter.info.mask_token_id
    block = torch.tensor([311, mask, mask, 64])
    filled = torch.tensor([311, 123, 45, 64])
    p = torch.tensor(PROMPT)
    out = []
    st = adapter.new_state()
    out.append(adapter.draft(st, EMPTY, p[:4], start=0, block_size=4, causal=False))
    st.advance(0)
    st2 = adapter.new_state()
    adapter.prefill(st2, p, block_size=4, causal=False)
    out.append(adapter.draft(st2, EMPTY, block, start=8, block_size=4, causal=False))
    out.append(adapter.verify(st2, filled, start=8, slots=[0, 1, 2, 3]))
    st3 = adapter.new_state()
    adapter.prefill(st3, p, block_size=4, causal=True)
    out.append(adapter.draft(st3, EMPTY, filled, start=8, block_size=4, causal=True))
    return out


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2", "llada2", "sdar_moe"])
def test_two_ranks_give_one_process_logits(family):
    _check(family, 2)


@pytest.mark.parametrize("family", ["sdar", "llada2", "sdar_moe"])
def test_four_ranks_replicate_the_kv_heads_and_give_one_process_logits(family):
    """4 heads, 2 KV heads over 4 ranks: ranks 0 and 1 hold KV head 0, ranks 2 and 3 KV head 1 (LLaDA2:
    2 of its 8 experts a rank; SDAR-MoE: 1 of its 4)."""
    _check(family, 4)


def _check(family: str, size: int) -> None:
    path = family_fixture(family)
    one = load_adapter(path, device="cpu", dtype="fp32")
    two = load_parallel(path, size, device="cpu", dtype="fp32")
    try:
        planned = _count_collectives(two.tp)
        want, got = _logits(one), _logits(two)
        assert planned and all(issued == n for issued, n in planned), planned
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape and a.shape[-1] == one.info.vocab_size
            torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
        total = sum(p.numel() * p.element_size() for p in one.model.parameters())
        share = 1.2 / size if size == 2 else 0.5  # KV heads replicated at 4 ranks; norms everywhere
        assert all(b < share * total for b in two.ranks.param_bytes), (two.ranks.param_bytes, total)
        assert len(two.ranks.param_bytes) == size
        n_experts = {"llada2": 8, "sdar_moe": 4}.get(family)
        if n_experts:  # experts split: E / size a rank, and the router whole
            moe = two.model.model.layers[1].mlp
            assert moe.experts.gate_up_proj.shape[0] == n_experts // size
            assert moe.gate.weight.shape[0] == n_experts
    finally:
        two.ranks.close()


def _count_collectives(tp) -> list[tuple[int, int]]:
    """Per forward of ``tp``'s rank 0: the collectives it issued and the number its plan lists (what rank
    0 completes with zeros after a failure must be exactly what the other ranks run)."""
    counts, forward = [], tp.forward

    def counted(message, run, plan=None):
        out = forward(message, run, plan)
        if plan is not None:
            counts.append((tp.issued, len(plan())))
        return out

    tp.forward = counted
    return counts


def test_kv_heads_of_each_rank():
    assert [kv_heads(r, 2, 4, 2) for r in range(2)] == [(0, 1), (1, 2)]
    assert [kv_heads(r, 4, 4, 2) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [kv_heads(r, 4, 8, 1) for r in range(4)] == [(0, 1)] * 4
    assert [kv_heads(r, 2, 4, 4) for r in range(2)] == [(0, 2), (2, 4)]

"""Routed experts (forward/routed_experts.py): the native Qwen3-MoE block's function (both ways of running
the experts: a product pair an expert, or two grouped products), per-token routing that ignores
batch-mates, and an expert-parallel split whose slices sum to the whole."""

from __future__ import annotations

import pytest
import torch

from s2d2.forward.routed_experts import RoutedExperts, grouped_ok, routed_experts_of


def _block(norm_topk_prob: bool, experts: int = 6, top_k: int = 2):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=32, moe_intermediate_size=16, num_experts=experts, num_experts_per_tok=top_k,
        norm_topk_prob=norm_topk_prob, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    torch.manual_seed(3)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    return block


@pytest.mark.parametrize("grouped", [False, True], ids=["looped", "grouped"])
@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_it_computes_the_native_block(norm_topk_prob, grouped):
    block = _block(norm_topk_prob)
    moe = routed_experts_of(block)
    assert moe is not None and moe.top_k == 2 and moe.normalize is norm_topk_prob and moe.n_experts == 6
    assert moe.grouped is grouped_ok(moe)
    if grouped and not moe.grouped:
        pytest.skip("torch._grouped_mm does not run here")
    moe.grouped = grouped
    x = torch.randn(37, 32)
    with torch.no_grad():
        want = block(x[None])[0]
    torch.testing.assert_close(moe.forward(x), want, atol=1e-5, rtol=0)


def test_a_tokens_route_and_output_do_not_depend_on_its_batch_mates():
    moe = routed_experts_of(_block(True))
    x = torch.randn(40, 32)
    ids, weights = moe.route(x)
    out = moe.forward(x)
    for t in (0, 17, 39):
        ids_t, weights_t = moe.route(x[t : t + 1])
        assert torch.equal(ids_t[0], ids[t])  # the same experts; weights equal up to the product's rounding
        torch.testing.assert_close(weights_t[0], weights[t], atol=1e-5, rtol=0)
        torch.testing.assert_close(moe.forward(x[t : t + 1])[0], out[t], atol=1e-5, rtol=0)
        others = torch.randn(9, 32)  # other batch-mates: the same route and output
        mixed = torch.cat([others[:4], x[t : t + 1], others[4:]])
        assert torch.equal(moe.route(mixed)[0][4], ids[t])
        torch.testing.assert_close(moe.forward(mixed)[4], out[t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("grouped", [False, True], ids=["looped", "grouped"])
def test_expert_slices_sum_to_the_whole_layer(grouped):
    """Expert parallelism: each slice holds experts [first, first + n) and computes their slots only; the
    one reduction (a sum over slices) gives the layer."""
    moe = routed_experts_of(_block(True))
    if grouped and not moe.grouped:
        pytest.skip("torch._grouped_mm does not run here")
    x = torch.randn(25, 32)
    parts = [
        RoutedExperts(moe.router, moe.gate_up[a:b], moe.down[a:b], moe.top_k, moe.normalize, first=a,
                      grouped=grouped)  # fmt: skip
        for a, b in ((0, 2), (2, 5), (5, 6))
    ]
    total = sum(p.forward(x) for p in parts)
    torch.testing.assert_close(total, moe.forward(x), atol=1e-5, rtol=0)
    assert all(bool(p.forward(x).abs().sum() > 0) for p in parts)


def test_other_mlps_run_as_their_module():
    from transformers import Glm4MoeConfig, Qwen3MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeMLP

    cfg = Glm4MoeConfig(hidden_size=32, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, num_hidden_layers=1, num_attention_heads=2)  # fmt: skip
    assert routed_experts_of(Glm4MoeMoE(cfg)) is None  # sigmoid router, shared experts
    assert routed_experts_of(Qwen3MoeMLP(Qwen3MoeConfig(hidden_size=32, intermediate_size=16))) is None

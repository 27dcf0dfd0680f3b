"""The SDAR-MoE adapter reproduces the native Qwen3-MoE backbone's own forward within 1e-4 (float32).

The goldens are computed here, as ``tests/fixtures/sdar/README.md`` describes for dense SDAR: the
test's own ``Qwen3MoeForCausalLM`` (config mapped by hand, experts stacked by hand from the checkpoint the
tests write, :mod:`sdar_moe_fixture`), SDPA with 4-D boolean masks, a ``DynamicCache`` cropped with
``crop(-n)``. Inputs and masks are those of the dense SDAR fixture: the block-causal prefill, a draft block
with masks, the 2L verification (whose second half is AR mode, block size 1) and a token-causal (AR-mode)
prefill. The adapter runs on both of its paths: the lean batched forward and transformers' own.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from s2d2.forward.masks import context_mask
from sdar_moe_fixture import EXPERTS, MASK, sdar_moe_checkpoint, sdar_moe_config

PROMPT = torch.tensor([17, 42, 101, 7, 250, 3, 88, 199])
BLOCK = torch.tensor([311, MASK, MASK, 64])
FILLED = torch.tensor([311, 123, 45, 64])
ATOL = 1e-4


def _native(norm_topk_prob: bool = True):
    """The reference: transformers' Qwen3MoeForCausalLM built from the checkpoint by hand."""
    from transformers import DynamicCache, Qwen3MoeConfig, Qwen3MoeForCausalLM

    c = sdar_moe_config()
    cfg = Qwen3MoeConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], rms_norm_eps=c["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": float(c["rope_theta"])},
        max_position_embeddings=c["max_position_embeddings"], tie_word_embeddings=False,
        use_sliding_window=False, sliding_window=None, decoder_sparse_step=c["decoder_sparse_step"],
        moe_intermediate_size=c["moe_intermediate_size"], num_experts=c["num_experts"],
        num_experts_per_tok=c["num_experts_per_tok"], norm_topk_prob=norm_topk_prob,
        mlp_only_layers=c["mlp_only_layers"],
    )  # fmt: skip
    model = Qwen3MoeForCausalLM._from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").eval()
    raw = {k: v.float() for k, v in load_file(str(sdar_moe_checkpoint() / "model.safetensors")).items()}
    sd = {k: v for k, v in raw.items() if ".experts." not in k}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        if f"{p}.0.gate_proj.weight" not in raw:
            continue
        gu = ("gate", "up")
        gate_up = [torch.cat([raw[f"{p}.{e}.{n}_proj.weight"] for n in gu]) for e in range(EXPERTS)]
        sd[f"{p}.gate_up_proj"] = torch.stack(gate_up)
        sd[f"{p}.down_proj"] = torch.stack([raw[f"{p}.{e}.down_proj.weight"] for e in range(EXPERTS)])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)

    def call(ids, pos, allowed, cache, keep):
        out = model(
            input_ids=ids[None], position_ids=pos[None], attention_mask=allowed[None, None], cache=cache,
            use_cache=True,
        )  # fmt: skip
        if keep < ids.numel():
            cache.crop(-(ids.numel() - keep))
        return out.logits[0]

    return model, call, lambda: DynamicCache(config=cfg)


def _goldens(causal: bool, norm_topk_prob: bool = True) -> dict[str, torch.Tensor]:
    """Prefill (block-causal, or token-causal with ``causal``), denoise and 2L verify logits."""
    model, call, new_cache = _native(norm_topk_prob)
    with torch.no_grad():
        cache = new_cache()
        pos = torch.arange(8)
        pre = call(PROMPT, pos, context_mask(pos, pos, 4, causal), cache, keep=8)
        den_mask = torch.ones(4, 12, dtype=torch.bool)
        if causal:  # the clean token before the first mask attends token-causally
            den_mask[0, 9:] = False
        den = call(BLOCK, torch.arange(8, 12), den_mask, cache, keep=0)
        ver_ids = torch.cat([FILLED, torch.full((4,), MASK)])
        ver_pos = torch.cat([torch.arange(8, 12), torch.arange(8, 12)])
        ver_mask = torch.zeros(8, 16, dtype=torch.bool)
        ver_mask[:, :8] = True
        for r in range(4):
            ver_mask[r, 8 : 9 + r] = True  # drafts 0..r
            ver_mask[4 + r, 8 : 8 + r] = True  # drafts strictly before
            ver_mask[4 + r, 12 + r] = True  # itself among the masks
        ver = call(ver_ids, ver_pos, ver_mask, cache, keep=0)
    return {"prefill": pre, "denoise": den, "verify": ver}


@pytest.fixture(scope="module", params=[False, True], ids=["default", "causal-cache"])
def golden(request):
    return request.param, _goldens(request.param)


@pytest.fixture(scope="module", params=["fast-path", "fast-path-looped", "transformers"])
def adapter(request):
    """The lean forward (its experts as grouped products where ``torch._grouped_mm`` runs, and as one
    product pair an expert) and transformers' own forward."""
    from s2d2.families import load_adapter

    ad = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="fp32")
    assert ad.info.family == "sdar_moe" and ad.info.mask_token_id == MASK and ad.info.default_block_size == 4
    if request.param == "transformers":
        ad.fast = None
    else:
        assert ad.fast is not None and ad.fast.weights[1].moe is not None and ad.fast.weights[0].moe is None
        if request.param == "fast-path-looped":
            ad.fast.weights[1].moe.grouped = False
    return ad


def test_sdar_moe_golden_through_protocol(adapter, golden):
    causal, g = golden
    state = adapter.new_state()
    pos = torch.arange(8)
    pre = adapter._forward(state, PROMPT, pos, context_mask(pos, pos, 4, causal), n_logits=8, keep=8)
    torch.testing.assert_close(pre, g["prefill"], atol=ATOL, rtol=0)

    state2 = adapter.new_state()
    adapter.prefill(state2, PROMPT, block_size=4, causal=causal)
    den = adapter.draft(state2, PROMPT[:0], BLOCK, start=8, block_size=4, causal=causal)
    assert state2.length == 8
    torch.testing.assert_close(den, g["denoise"], atol=ATOL, rtol=0)

    ver = adapter.verify(state2, FILLED, start=8, slots=[0, 1, 2, 3])  # AR mode (block size 1)
    torch.testing.assert_close(ver, g["verify"][4:], atol=ATOL, rtol=0)
    sub = adapter.verify(state2, FILLED, start=8, slots=[1, 2])
    torch.testing.assert_close(sub, g["verify"][5:7], atol=ATOL, rtol=0)


def test_block_size_one_prefill_is_ar_mode(adapter):
    """A block-causal prefill with blocks of 1 is the token-causal (AR-mode) one."""
    g = _goldens(True)
    state = adapter.new_state()
    pos = torch.arange(8)
    pre = adapter._forward(state, PROMPT, pos, context_mask(pos, pos, 1, False), n_logits=8, keep=8)
    torch.testing.assert_close(pre, g["prefill"], atol=ATOL, rtol=0)


def test_the_goldens_route_through_several_experts_and_the_tolerance_has_teeth():
    """The routing is not degenerate (the prompt's tokens use every expert), and getting the router's
    normalisation wrong (``norm_topk_prob`` off) is far outside the tolerance."""
    from s2d2.families import load_adapter

    ad = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="fp32")
    moe, seen = ad.fast.weights[1].moe, []
    route = moe.route
    moe.route = lambda x: seen.append(route(x)[0]) or route(x)
    ad.prefill(ad.new_state(), PROMPT, block_size=4, causal=False)
    assert set(torch.cat(seen).flatten().tolist()) == set(range(EXPERTS))
    right, wrong = _goldens(False), _goldens(False, norm_topk_prob=False)
    assert float((right["denoise"] - wrong["denoise"]).abs().max()) > 100 * ATOL

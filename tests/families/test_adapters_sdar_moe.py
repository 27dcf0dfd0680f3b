"""SDAR-MoE detection (model_type, architecture, auto_map names as published) and its dense-layer schedule
(``decoder_sparse_step``, ``mlp_only_layers``) as the loaded Qwen3-MoE backbone builds it."""

from __future__ import annotations

import json

import pytest
import torch

from s2d2.families import detect_family, load_adapter, sdar, sdar_moe
from sdar_moe_fixture import make_random_sdar_moe, sdar_moe_checkpoint


def test_detected_by_type_architecture_and_auto_map_and_not_confused_with_dense_sdar():
    assert detect_family({"model_type": "sdar_moe"}) is sdar_moe
    assert detect_family({"architectures": ["SDARMoeForCausalLM"]}) is sdar_moe
    auto = {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
            "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"}  # fmt: skip
    assert detect_family({"model_type": "custom", "auto_map": auto}) is sdar_moe
    assert detect_family({"model_type": "sdar", "architectures": ["SDARForCausalLM"]}) is sdar


@pytest.mark.parametrize(
    ("step", "mlp_only", "experts", "sparse"),
    [(1, [], 4, [0, 1, 2, 3, 4, 5]), (2, [], 4, [1, 3, 5]), (2, [3], 4, [1, 5]), (1, [0, 5], 4, [1, 2, 3, 4]),
     (1, [], 0, [])],
)  # fmt: skip
def test_the_dense_layer_schedule(step, mlp_only, experts, sparse):
    config = {"num_hidden_layers": 6, "num_experts": experts, "decoder_sparse_step": step,
              "mlp_only_layers": mlp_only}  # fmt: skip
    assert sdar_moe.sparse_layers(config) == sparse


def test_the_loaded_backbone_follows_the_schedule(tmp_path):
    """Layer 0 dense (``mlp_only_layers``), layer 1 routed; with ``decoder_sparse_step`` 2 and no
    ``mlp_only_layers`` the same two layers come out; the fast forward routes exactly the sparse one."""
    ad = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="fp32")
    kinds = [type(la.mlp).__name__ for la in ad.model.model.layers]
    assert kinds == ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"]
    assert [w.moe is not None for w in ad.fast.weights] == [False, True]
    moe = ad.fast.weights[1].moe
    assert ad.fast.capturable is moe.grouped  # captured only where the experts run as grouped products
    assert (moe.n_experts, moe.top_k, moe.normalize) == (4, 2, True)

    d = make_random_sdar_moe(tmp_path / "step2")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[])
    (d / "config.json").write_text(json.dumps(cfg))
    ad2 = load_adapter(d, device="cpu", dtype="fp32")
    assert [type(la.mlp).__name__ for la in ad2.model.model.layers] == kinds
    assert [w.moe is not None for w in ad2.fast.weights] == [False, True]


def test_bf16_loads_and_agrees_with_fp32_on_the_argmax():
    ad32 = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="fp32")
    ad16 = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="bf16")
    assert ad16.dtype == torch.bfloat16 and ad16.fast.weights[1].moe.gate_up.dtype == torch.bfloat16
    block = torch.tensor([311, 509, 509, 64])
    prompt = torch.tensor([17, 42, 101, 7, 250, 3, 88, 199])
    outs = []
    for ad in (ad32, ad16):
        state = ad.new_state()
        outs.append(ad.draft(state, prompt, block, start=8, block_size=4, causal=False).float())
    assert (outs[0] - outs[1]).abs().max() < 0.5


def test_the_grouped_forward_compiles_whole_and_replays_a_generation():
    """With the experts as grouped products the body takes no host read: it compiles whole
    (``fullgraph=True``, bf16 as ``torch._grouped_mm`` compiles) to the eager logits, and a generation on
    static buffers (the CUDA-graph replay, emulated) gives the eager tokens."""
    from s2d2.forward.forward_batch import BatchShape, build_batch
    from s2d2.layouts.mask_spec import spec_of

    def batch(sizes, pad=None):  # rows of random tokens after each row's cache, causal and bidirectional
        g = torch.Generator().manual_seed(0)
        ids = [torch.randint(3, 300, (n,), generator=g).tolist() for n in sizes]
        pos = [list(range(st.length, st.length + n)) for st, n in zip(states, sizes, strict=True)]
        full = [torch.ones(n, n, dtype=torch.bool) for n in sizes]
        specs = [spec_of(m.tril() if r % 2 else m) for r, m in enumerate(full)]
        return build_batch([st.length for st in states], ids, pos, specs, [pool.table(st) for st in states],
                           [torch.arange(n) for n in sizes], pool.page_size, n_heads=fast.n_heads,
                           n_kv=fast.n_kv, pad=pad).to("cpu")  # fmt: skip

    ad = load_adapter(sdar_moe_checkpoint(), device="cpu", dtype="bf16")
    fast = ad.fast
    if not fast.weights[1].moe.grouped:
        pytest.skip("torch._grouped_mm does not run here")
    pool = fast.new_pool(page_size=16)
    states = [pool.new_state() for _ in range(3)]
    gen = torch.Generator().manual_seed(1)
    for st, n in zip(states, (20, 7, 33), strict=True):
        pool.ensure(st, n + 16)
        for i in range(len(fast.layers)):
            for t in (pool.k[i], pool.v[i]):
                t[:, pool.table(st)] = torch.randn(t[:, pool.table(st)].shape, generator=gen).to(t.dtype)
        st.length = n
    body = torch.compile(
        lambda b: fast.run_batch(pool, b), fullgraph=True, backend="aot_eager", dynamic=False
    )
    for sizes, pad in (((3, 5, 1), BatchShape(16, 4, 8, 4, 16)), ((8, 2, 4), BatchShape(32, 4, 8, 4, 32))):
        with torch.no_grad():
            compiled = body(batch(sizes, pad))
            eager = fast.run_batch(pool, batch(sizes))
        torch.testing.assert_close(compiled[: sum(sizes)], eager, atol=1e-2, rtol=0)

    import s2d2

    model = s2d2.load(sdar_moe_checkpoint(), device="cpu", dtype="fp32", max_num_seqs=3)
    fast = model.adapter.fast
    assert fast.capturable
    prompts = [[17, 42, 101, 7, 250, 3, 88, 199, 5], [3, 1, 4, 1, 5], [100, 200, 300, 400, 7, 9, 11]]
    cfg = model.make_config(preset="lossless", block_size=4, max_new_tokens=16, ignore_eos=True)
    eager = [r.token_ids for r in model.generate_batch(prompts, cfg)]
    fast.static = fast.static_runner(graphs=False, max_tokens=64)
    model._engine = None
    replayed = [r.token_ids for r in model.generate_batch(prompts, cfg)]
    assert fast.static.replays > 10 and replayed == eager

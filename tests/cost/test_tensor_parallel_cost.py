"""The roofline's price of a tensor-parallel forward: one rank's share of the weights and KV plus the
all-reduces over NVLink, whether a rank fits its GPU's memory, bad sizes, and bench-batch projecting
LLaDA2.x-flash (scripts/shapes/llada2-flash.json) on N GPUs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_cli
from s2d2.cost import hardware
from s2d2.cost.step_cost import HARDWARE, ModelShape, RooflineCost, StepShape, roofline
from s2d2.errors import S2D2Error

SHAPES = Path(__file__).resolve().parents[2] / "scripts" / "shapes"
SDAR_8B = json.loads((SHAPES / "sdar-8b.json").read_text())
FLASH = SHAPES / "llada2-flash.json"
STEPS = [StepShape((1,), (1024,)), StepShape((16,) * 8, (300,) * 8), StepShape((54,) * 32, (1024,) * 32)]


def _one_gpu_price(m: ModelShape, hw, shape: StepShape) -> float:
    """The one-GPU roofline as it priced a dense model before tensor parallelism (the reference)."""
    kv = sum(c + q for q, c in zip(shape.queries, shape.contexts, strict=True))
    flops = 2 * m.params * shape.tokens + 4 * m.layers * m.heads * m.head_dim * shape.attention
    nbytes = m.bytes_per_value * (m.params + 2 * m.layers * m.kv_heads * m.head_dim * kv)
    compute = flops / (hw.peak_flops * hw.compute_efficiency)
    memory = nbytes / (hw.bandwidth * hw.memory_efficiency)
    return 1e3 * (max(compute, memory) + hw.overhead_s)


def test_one_rank_is_the_one_gpu_price_exactly():
    for name in ("h200", "h100", "a100"):
        cost = roofline(f"roofline:{name}", SDAR_8B, tensor_parallel_size=1)
        assert cost.comm_s(4096) == 0.0
        for shape in STEPS:
            assert cost.predict_ms(shape) == _one_gpu_price(cost.model, HARDWARE[name], shape)
    assert roofline("roofline:h200", SDAR_8B) == roofline("roofline:h200", SDAR_8B, 1)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_n_ranks_divide_the_weight_and_kv_read_by_n_plus_the_all_reduces(tp):
    one = roofline("roofline:h200", SDAR_8B)
    many = dataclasses.replace(one, tp=tp)
    hw = one.hw
    shape = StepShape((1,) * 4, (2048,) * 4)  # memory-bound on one GPU and on N
    memory_one = one.predict_ms(shape) - 1e3 * hw.overhead_s
    memory_many = many.predict_ms(shape) - 1e3 * (hw.overhead_s + many.comm_s(shape.tokens))
    assert memory_many == pytest.approx(memory_one / tp, rel=1e-12)
    assert many.comm_s(shape.tokens) > 0
    # the held weights split N ways too, but for the replicated norms
    norms = one.model.layers * (2 * one.model.hidden + 2 * one.model.head_dim) + one.model.hidden
    assert many.model.held_params(tp) == pytest.approx((one.model.total_params - norms) / tp + norms)


def test_kv_heads_fewer_than_ranks_are_replicated_and_the_router_is_not_split():
    m = ModelShape.from_config(json.loads(FLASH.read_text()))  # 4 key/value heads
    assert [m.kv_heads_per_rank(tp) for tp in (1, 2, 4, 8)] == [4, 2, 1, 1]
    assert m.kv_bytes_per_position(8) == m.kv_bytes_per_position(4) == m.kv_bytes_per_position(1) // 4
    # at 4 and 8 ranks alike, every rank reads one key/value head's projections and the whole router
    # (hidden x experts per MoE layer); all else halves from 4 ranks to 8
    whole = m.layers * m.hidden * m.head_dim * 2 + m.router_params
    assert m.read_params(1, 8) - whole == pytest.approx((m.read_params(1, 4) - whole) / 2, rel=1e-12)


def test_the_all_reduce_term_grows_with_layers_and_tokens():
    cost = roofline("roofline:h200", SDAR_8B, tensor_parallel_size=4)
    deeper = dataclasses.replace(cost, model=dataclasses.replace(cost.model, layers=2 * cost.model.layers))
    terms = [cost.comm_s(t) for t in (1, 64, 4096)]
    assert terms == sorted(terms) and terms[0] < terms[-1]
    assert deeper.comm_s(64) > 1.9 * cost.comm_s(64)
    # a one-token forward: the latency of the embedding's, two per layer and the LM head's
    floor = (2 * cost.model.layers + 2) * hardware.COLLECTIVE_LATENCY_S
    assert floor < cost.comm_s(1) < 1.01 * floor
    # more ranks: more of each buffer on the wire, the same count of collectives
    assert dataclasses.replace(cost, tp=8).comm_s(4096) > cost.comm_s(4096)


def test_moe_reads_the_experts_its_tokens_touch():
    m = ModelShape.from_config(json.loads(FLASH.read_text()))
    assert 95e9 < m.total_params < 110e9  # "100B"
    assert 4e9 < m.params < 7e9  # about 6B active per token
    assert m.experts_touched(1) == pytest.approx(m.experts_per_token)
    assert m.experts_touched(16) < m.experts_touched(128) < m.experts
    assert m.read_params(128, 4) > 3 * m.read_params(1, 4)  # a wide step reads most experts


def test_a_qwen3_moe_config_counts_its_dense_layers_by_its_schedule():
    """SDAR-MoE (Qwen3-MoE) names its dense layers by ``mlp_only_layers`` and ``decoder_sparse_step``."""
    base = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=8, vocab_size=100, num_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=128)  # fmt: skip
    assert ModelShape.from_config(base).dense_layers == 0
    assert ModelShape.from_config({**base, "mlp_only_layers": [0, 5]}).dense_layers == 2
    assert ModelShape.from_config({**base, "decoder_sparse_step": 2}).dense_layers == 4
    both = {**base, "decoder_sparse_step": 2, "mlp_only_layers": [0, 1]}
    assert ModelShape.from_config(both).dense_layers == 5
    assert ModelShape.from_config({**base, "first_k_dense_replace": 1}).dense_layers == 1


def test_memory_fit():
    assert "does not fit" in roofline("roofline:h200", FLASH).memory_line(1)
    two = roofline("roofline:h200", FLASH, tensor_parallel_size=2)
    assert two.memory_line(128 * 512) is None
    line = two.memory_line(10**7)  # the weights fit, ten million cached positions do not
    assert "does not fit" in line and "tensor parallel 2" in line
    assert roofline("roofline:h100", FLASH, tensor_parallel_size=2).memory_line(1) is not None
    assert roofline("roofline:h100", FLASH, tensor_parallel_size=4).memory_line(128 * 512) is None


def test_bad_tensor_parallel_sizes_are_one_line_errors():
    with pytest.raises(S2D2Error, match="must divide the model's 32 attention heads"):
        roofline("roofline:h200", FLASH, tensor_parallel_size=3)
    with pytest.raises(S2D2Error, match=">= 1"):
        roofline("roofline:h200", FLASH, tensor_parallel_size=0)
    gqa = dict(SDAR_8B, num_attention_heads=24, num_key_value_heads=8)
    with pytest.raises(S2D2Error, match="key/value heads"):
        roofline("roofline:h200", gqa, tensor_parallel_size=12)
    moe = dict(json.loads(FLASH.read_text()), num_experts=6)
    with pytest.raises(S2D2Error, match="6 experts"):
        roofline("roofline:h200", moe, tensor_parallel_size=4)
    with pytest.raises(S2D2Error, match="attention heads"):
        RooflineCost(ModelShape.from_config(SDAR_8B), HARDWARE["h200"], 5)


BENCH = ["bench-batch", "--n", "4", "--limits", "1,16", "--configs", "ar", "--max-new-tokens", "16",
         "--threads", "1", "--no-progress", "--simulate", "roofline:h200", "--shape", str(FLASH)]  # fmt: skip


def test_bench_batch_projects_llada2_flash_on_n_gpus(capsys, tmp_path):
    out = tmp_path / "tp2.json"
    code, text, err = run_cli(capsys, *BENCH, "-tp", "2", "--json", str(out))
    assert code == 0, err
    assert "PROJECTED tokens/s" in text and "at tensor parallel 2" in text
    res = json.loads(out.read_text())
    assert res["projected"].endswith("llada2-flash.json at tensor parallel 2")
    figures = [r["projected_tokens_per_s"] for r in res["rows"]]
    assert all(isinstance(f, float) and f > 0 for f in figures)
    # one GPU cannot hold the 100B model: said so, and no figure
    code, text, err = run_cli(capsys, *BENCH, "--tensor-parallel-size", "1")
    assert code == 0, err
    assert "does not fit" in text and "PROJECTED tokens/s" not in text and "|" not in text


def test_bench_batch_marks_the_batch_sizes_that_do_not_fit(capsys, monkeypatch):
    cost = roofline("roofline:h200", FLASH, tensor_parallel_size=4)
    kv = cost.model.kv_bytes_per_position(4)
    # room for the weights and 400 cached positions: one row fits, 16 rows do not
    memory = (cost.weight_bytes() + 400 * kv) / HARDWARE["h200"].memory_usable
    monkeypatch.setitem(HARDWARE, "h200", dataclasses.replace(HARDWARE["h200"], memory_bytes=memory))
    code, text, err = run_cli(capsys, *BENCH, "-tp", "4")
    assert code == 0, err
    rows = [line for line in text.splitlines() if line.startswith("| ar |")]
    assert len(rows) == 2 and "does not fit" not in rows[0] and "does not fit" in rows[1]
    assert "PROJECTED at 16 rows: does not fit" in text


def test_bench_batch_tensor_parallel_errors(capsys, tmp_path):
    code, _, err = run_cli(capsys, *BENCH, "-tp", "3")
    assert_one_line_error(code, err, "must divide the model's 32 attention heads")
    # without --simulate, -tp loads ranks: a size the built-in model's 4 heads refuse is a one-line error
    code, _, err = run_cli(capsys, "bench-batch", "--n", "4", "--limits", "1", "-tp", "3")
    assert_one_line_error(code, err, "does not divide the model's 4 attention heads")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"cells": [{"batch": 1, "context": 1, "query": 1, "ms": 1.0}] * 4}))
    code, _, err = run_cli(capsys, "bench-batch", "--n", "4", "--limits", "1", "--simulate", str(profile),
                           "-tp", "2")  # fmt: skip
    assert_one_line_error(code, err, "needs roofline:NAME")

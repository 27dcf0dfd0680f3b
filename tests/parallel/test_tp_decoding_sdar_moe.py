"""SDAR-MoE over two ranks (two processes on the CPU, gloo; the experts split 2 + 2, the router whole on
each rank) decodes the same tokens as one process, and each rank holds half of the weights.

The SDAR-MoE checkpoint the tests write (:mod:`sdar_moe_fixture`: a dense layer, then a sparse one of 4
experts, top-2) loaded once alone and once over two ranks; a handful of prompts decoded in one batch
under AR and lossless (verified apart and fused) decoding.
"""

from __future__ import annotations

import pytest

import s2d2
from sdar_moe_fixture import sdar_moe_checkpoint

pytestmark = pytest.mark.tensor_parallel

ROWS = 6
NEW = 16
PROMPTS = [
    [17, 42, 101, 7, 250, 3, 88, 199, 5],
    [3, 1, 4, 1, 5],
    [100, 200, 300, 400, 7, 9, 11],
    [60, 61, 62],
    [250, 17, 300, 5, 5, 480, 2, 33, 71, 8, 400],
    [9, 99, 199, 299],
]
CONFIGS = {
    "ar": dict(decoder="ar"),
    "lossless": dict(preset="lossless", block_size=4),
    "lossless-fused": dict(preset="lossless-fused", block_size=4),
}


def _load(tp: int):
    return s2d2.load(sdar_moe_checkpoint(), device="cpu", dtype="fp32", max_num_seqs=ROWS,
                     tensor_parallel_size=tp)  # fmt: skip


@pytest.fixture(scope="module")
def one():
    return _load(1)


@pytest.fixture(scope="module")
def two():
    model = _load(2)
    yield model
    model.adapter.ranks.close()


def _tokens(model, **cfg) -> list[list[int]]:
    results = model.generate_batch(PROMPTS, max_new_tokens=NEW, ignore_eos=True, **cfg)
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def decoded_two(two):
    return {name: _tokens(two, **cfg) for name, cfg in CONFIGS.items()}


def test_each_rank_holds_half_of_the_split_weights(one, two):
    """Everything is split but the router and the norms (replicated): a rank holds exactly half of the
    rest, its 2 experts of 4 included."""
    params = dict(one.adapter.model.named_parameters())
    total = sum(p.numel() * p.element_size() for p in params.values())
    whole = sum(p.numel() * p.element_size() for k, p in params.items()
                if "norm" in k or k.endswith("mlp.gate.weight"))  # fmt: skip
    assert two.adapter.ranks.param_bytes == [(total - whole) // 2 + whole] * 2, (total, whole)
    moe = two.adapter.model.model.layers[1].mlp
    assert moe.experts.gate_up_proj.shape[0] == 2 and moe.gate.weight.shape[0] == 4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tp2_decodes_the_same_tokens_as_tp1(one, decoded_two, name):
    assert [len(t) for t in decoded_two[name]] == [NEW] * len(PROMPTS)
    assert decoded_two[name] == _tokens(one, **CONFIGS[name])


def test_lossless_equals_ar_under_tp2(decoded_two):
    assert decoded_two["lossless"] == decoded_two["ar"]
    assert decoded_two["lossless-fused"] == decoded_two["ar"]


def test_experts_that_do_not_divide_over_the_ranks_are_a_one_line_error(tmp_path):
    """4 heads, 2 KV heads and 128 columns split over 4 ranks; 6 experts do not: refused before any
    process starts."""
    import json

    from s2d2.errors import ModelLoadError
    from sdar_moe_fixture import make_random_sdar_moe

    path = make_random_sdar_moe(tmp_path / "six")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_experts": 6}))
    with pytest.raises(ModelLoadError, match=r"^six: tensor_parallel_size 4 does not divide the model's "
                       r"num_experts \(6\)$"):  # fmt: skip
        s2d2.load(path, device="cpu", dtype="fp32", tensor_parallel_size=4)

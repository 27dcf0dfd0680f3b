"""Step-cost profiles: a fit of measured forwards, its file, the roofline projection, and the engine
and bench-batch recording predicted step time beside the measured one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_one_line_error, run_cli
from s2d2 import load
from s2d2.cost import profile as cost_profile
from s2d2.cost.step_cost import (
    HARDWARE,
    FittedCost,
    ModelShape,
    RooflineCost,
    StepShape,
    measured_profile,
    median_abs_error,
    roofline,
)
from s2d2.engine.llm_engine import LLMEngine
from s2d2.errors import S2D2Error
from s2d2.tasks.tiny_gsm.splits import load_split

SDAR_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 36,
    "intermediate_size": 12288,
    "vocab_size": 151936,
}


def _cells(coef):
    a, b, c, d = coef
    cells = []
    for batch in (1, 4, 16):
        for q in (1, 8, 32):
            for ctx in (16, 128):
                s = StepShape((q,) * batch, (ctx,) * batch)
                ms = a + b * batch + c * s.tokens + d * s.padded_attention / 1000
                cells.append({"batch": batch, "query": q, "context": ctx, "ms": ms})
    return cells


def test_fit_recovers_a_known_cost_and_round_trips(tmp_path):
    prof = FittedCost.fit(_cells((0.5, 0.02, 0.01, 0.003)), {"model": "m"})
    assert prof.coef == pytest.approx((0.5, 0.02, 0.01, 0.003), rel=1e-6, abs=1e-9)
    shape = StepShape((4, 1, 1), (100, 20, 300), groups=((3, 4, 301),))
    assert prof.predict_ms(shape) == pytest.approx(0.5 + 0.06 + 0.06 + 0.003 * 3 * 4 * 301 / 1000)
    path = tmp_path / "p.json"
    prof.save(path)
    again = FittedCost.load(path)
    assert again.coef == pytest.approx(prof.coef) and again.key == {"model": "m"}
    # a bench-forward file (cells only) is fitted on reading
    path.write_text(json.dumps({"device": "cpu", "dtype": "float32", "cells": _cells((1, 0, 0.1, 0))}))
    assert FittedCost.load(path).coef == pytest.approx((1, 0, 0.1, 0), abs=1e-9)


def test_measured_profile_calibrates_only_when_the_key_differs(tmp_path):
    calls = []

    def measure(adapter, queries, contexts, batches, repeats):
        calls.append(1)
        return _cells((0.3, 0.01, 0.02, 0.0))

    path = tmp_path / "profile.json"
    key = {"model": "tiny", "device": "cpu", "dtype": "float32", "threads": 1}
    measured_profile(None, path, key, measure)
    measured_profile(None, path, key, measure)
    assert len(calls) == 1  # read back, not measured again
    measured_profile(None, path, {**key, "threads": 2}, measure)
    assert len(calls) == 2 and json.loads(path.read_text())["key"]["threads"] == 2


def test_without_a_profile_an_accelerator_is_measured_once_and_the_cpu_is_not(tmp_path, monkeypatch):
    calls = []

    def measure(adapter, queries, contexts, batches, repeats):
        calls.append(1)
        return _cells((3.0, 0.001, 0.0001, 0.0))  # a GPU's shape of costs: the forward's fixed part

    monkeypatch.setattr(cost_profile, "measure", measure)
    monkeypatch.setattr(cost_profile, "measure_mixed", lambda *a: [])  # the mixed steps: test_mixed_steps
    monkeypatch.setenv("S2D2_CACHE_DIR", str(tmp_path / "cache"))
    gpu = SimpleNamespace(device=torch.device("meta"), dtype=torch.bfloat16, fast=object())
    resolve = cost_profile.resolve_cost_profile
    first = resolve(None, gpu, model_path=tmp_path, model_name="m")
    assert isinstance(first, FittedCost) and first.coef == pytest.approx((3.0, 0.001, 0.0001, 0.0), abs=1e-9)
    (cached,) = (tmp_path / "cache" / "cost-profiles").iterdir()
    assert resolve(None, gpu, model_path=tmp_path, model_name="m").coef == first.coef and len(calls) == 1
    other = tmp_path / "other"
    resolve(None, gpu, model_path=other, model_name="m")  # another model of the same name: its own entry
    assert len(calls) == 2 and len(list(cached.parent.iterdir())) == 2
    cached.write_text("{not json")  # a broken cache entry is ours to replace
    again = resolve(None, gpu, model_path=tmp_path, model_name="m")
    assert again.coef == pytest.approx(first.coef, abs=1e-9) and len(calls) == 3
    assert FittedCost.load(cached).coef == pytest.approx(first.coef, abs=1e-9)
    cpu = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, fast=object())
    assert resolve(None, cpu, model_path=tmp_path, model_name="m") is None and len(calls) == 3
    lean_less = SimpleNamespace(device=torch.device("meta"), dtype=torch.bfloat16, fast=None)
    assert resolve(None, lean_less, model_path=tmp_path, model_name="m") is None


def test_a_default_profile_that_cannot_be_measured_or_cached_does_not_stop_a_load(tmp_path, monkeypatch):
    gpu = SimpleNamespace(device=torch.device("meta"), dtype=torch.bfloat16, fast=object())
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("S2D2_CACHE_DIR", str(blocker))  # nothing can be written below a file
    monkeypatch.setattr(cost_profile, "measure", lambda *a: _cells((3.0, 0.001, 0.0001, 0.0)))
    monkeypatch.setattr(cost_profile, "measure_mixed", lambda *a: [])
    with pytest.warns(UserWarning, match="not cached"):
        prof = cost_profile.resolve_cost_profile(None, gpu, model_path=tmp_path, model_name="m")
    assert isinstance(prof, FittedCost) and blocker.read_text() == "not a folder"

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setenv("S2D2_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cost_profile, "measure", out_of_memory)
    with pytest.warns(UserWarning, match="built-in"):
        assert cost_profile.resolve_cost_profile(None, gpu, model_path=tmp_path, model_name="m") is None


def test_roofline_is_memory_bound_at_one_row_and_compute_bound_when_wide():
    cost = roofline("roofline:h200", SDAR_8B)
    weights = 2 * ModelShape.from_config(SDAR_8B).params
    one = cost.predict_ms(StepShape((1,), (1024,)))
    hw = HARDWARE["h200"]
    memory_s = weights / (hw.bandwidth * hw.memory_efficiency)
    assert one == pytest.approx(1e3 * (memory_s + hw.overhead_s), rel=0.01)
    # 64 query tokens cost about the same as one at batch 1 (the weights are read once) ...
    assert cost.predict_ms(StepShape((64,), (1024,))) < 1.2 * one
    # ... but 32 rows x 54 tokens are compute-bound: several times one AR step of 32 rows
    wide = cost.predict_ms(StepShape((54,) * 32, (1024,) * 32))
    assert wide > 3 * cost.predict_ms(StepShape((1,) * 32, (1024,) * 32))
    assert roofline("roofline:a100", SDAR_8B).predict_ms(StepShape((1,), (1024,))) > one
    with pytest.raises(S2D2Error, match="unknown hardware"):
        roofline("roofline:tpu", SDAR_8B)
    with pytest.raises(S2D2Error, match="lacks"):
        RooflineCost(ModelShape.from_config({"hidden_size": 8}), hw)


def test_engine_records_predicted_time_beside_measured():
    tiny = load("tiny-gsm")
    cost = FittedCost((1.0, 0.0, 0.0, 0.0))  # 1 ms a forward, whatever its shape
    engine = LLMEngine(tiny.adapter, max_num_seqs=4, cost=cost)
    prompts = [tiny.encode(p["question"]) for p in load_split("test")[:4]]
    engine.generate(prompts, [tiny.make_config(decoder="ar", max_new_tokens=8)] * 4)
    stats = engine.stats()
    assert stats["predicted_ms_per_step"] == pytest.approx(1.0)
    assert stats["predicted_abs_error"] >= 0
    assert LLMEngine(tiny.adapter).stats()["predicted_ms_per_step"] is None
    assert median_abs_error([(1.0, 2.0), (3.0, 3.0), (1.0, 1.0)]) == 0.0


def test_bench_batch_simulates_a_gpu_and_labels_it_projected(capsys, tmp_path):
    shape = tmp_path / "sdar-8b.json"
    shape.write_text(json.dumps(SDAR_8B))
    out = tmp_path / "sim.json"
    args = ["bench-batch", "--n", "4", "--limits", "1,4", "--configs", "ar,lossless-b16", "--no-progress"]
    code, text, err = run_cli(
        capsys, *args, "--simulate", "roofline:h200", "--shape", str(shape), "--json", str(out)
    )
    assert code == 0, err
    assert "PROJECTED" in text
    res = json.loads(out.read_text())
    assert res["projected"].startswith("roofline:h200")
    ar1 = next(r for r in res["rows"] if r["config"] == "ar" and r["max_num_seqs"] == 1)
    # an 8B model on the roofline: one AR row is memory-bound, a few ms a step whatever the tiny model does
    assert 3.0 < ar1["predicted_ms_per_step"] < 6.0
    # tokens/s on the simulated clock: the predicted forwards, then those plus the host time measured
    # here (not compared with this machine's wall-clock tokens/s, which moves with its load)
    steps = ar1["forwards_per_s"] * ar1["seconds"]
    on_clock = ar1["tokens"] / (ar1["predicted_ms_per_step"] * steps / 1e3)
    assert ar1["projected_forward_tokens_per_s"] == pytest.approx(on_clock, rel=0.02)
    assert 0 < ar1["projected_tokens_per_s"] < ar1["projected_forward_tokens_per_s"]
    code, _, err = run_cli(capsys, *args, "--simulate", "h200")
    assert_one_line_error(code, err, "roofline:NAME or a measured profile file")
    code, _, err = run_cli(capsys, *args, "--shape", str(shape))
    assert_one_line_error(code, err, "--shape goes with --simulate")


def test_bench_batch_projects_onto_a_profile_measured_for_another_model(capsys, tmp_path):
    profile = tmp_path / "sdar-8b-h200.json"  # as bench-forward --json writes it on a GPU
    cells = [{"batch": b, "context": c, "query": q, "ms": 5.0 + 0.01 * b * q + 0.001 * b * c * q / 1000}
             for b in (1, 8, 32) for c in (128, 1024) for q in (1, 4, 16, 64)]  # fmt: skip
    profile.write_text(json.dumps({"device": "cuda", "dtype": "bf16", "cells": cells}))
    out = tmp_path / "sim.json"
    args = ["bench-batch", "--n", "4", "--limits", "1", "--configs", "ar", "--no-progress"]
    code, text, err = run_cli(capsys, *args, "--simulate", str(profile), "--json", str(out))
    assert code == 0, err
    assert "PROJECTED" in text
    res = json.loads(out.read_text())
    assert res["projected"].startswith(f"the measured profile {profile}") and "cuda" in res["projected"]
    (ar1,) = res["rows"]
    assert 4.5 < ar1["predicted_ms_per_step"] < 6.0  # the profile's ~5 ms a forward, not this CPU's
    code, _, err = run_cli(capsys, *args, "--simulate", str(profile), "--shape", str(profile))
    assert_one_line_error(code, err, "a measured profile has its own model")

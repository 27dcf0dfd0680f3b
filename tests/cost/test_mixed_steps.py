"""Calibration on steps shaped like the engine's: rows of every kind (AR, draft, plain and fused
verification, prefill) at spread cached lengths in one forward, through the engine's forward path; the
cells record the step as the engine describes it, and the fit reads them beside the uniform grid."""

from __future__ import annotations

import pytest

from s2d2 import load
from s2d2.cost import profile as cost_profile
from s2d2.cost.mixed_steps import BLOCK, PREFILL, measure_mixed
from s2d2.cost.step_cost import CALIBRATION_KIND, FittedCost, StepShape, calibrate, profile_key
from s2d2.forward import fastpath


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-gsm", use_preset=False, device="cpu")


def test_mixed_cells_are_real_steps_through_the_packed_forward(tiny, monkeypatch):
    ad = tiny.adapter
    seen: list[list[int]] = []
    real = fastpath.FastDecoder.run_batch

    def spy(self, pool, b, *rest):
        seen.append(list(b.logit_sizes))
        return real(self, pool, b, *rest)

    monkeypatch.setattr(fastpath.FastDecoder, "run_batch", spy)
    mixes = ((5, ("ar", "draft", "verify", "fused", "prefill")),)
    cells = measure_mixed(ad, (32, 96), repeats=1, mixes=mixes)
    assert len(cells) == 2 and len(seen) == 2 * 2  # a warm-up and one timed forward a cell
    for cell in cells:
        q = cell["queries"]
        assert q[0] == 1 and q[1] == 1 + BLOCK and q[4] == PREFILL  # AR, pending + block, prefill chunk
        spans = range(2, BLOCK + 1)  # slots 1..k-1 of a block: two halves, plus pre-draft groups when fused
        assert q[2] in {2 * (k - 1) for k in spans}
        assert q[3] in {k + (k - 1) + sum(BLOCK - j for j in range(1, k)) for k in spans}
        assert all(32 <= c <= 96 for c in cell["contexts"]) and cell["ms"] > 0
        shape = StepShape(tuple(q), tuple(cell["contexts"]), tuple(map(tuple, cell["groups"])))
        assert sum(r for r, _, _ in shape.groups) == 5  # every row in one attention group
    assert cells[0]["contexts"] == [32] * 5 and len(set(cells[1]["contexts"])) > 1
    # logit rows: AR one, a draft its block, the prefill none (the verifications' counts vary)
    assert seen[0][0] == 1 and seen[0][1] == BLOCK and seen[0][4] == 0
    assert seen[0] == seen[1]  # the timed forward repeats the warm-up's step (cached lengths restored)


def test_the_fit_reads_mixed_steps_beside_uniform_cells():
    coef = (0.4, 0.03, 0.02, 0.005)

    def ms(shape):
        a, b, c, d = coef
        return a + b * shape.rows + c * shape.tokens + d * shape.padded_attention / 1000

    cells = []
    for batch, q, ctx in ((1, 1, 16), (4, 8, 64), (16, 2, 128), (2, 32, 16)):
        uniform = StepShape((q,) * batch, (ctx,) * batch)
        cells.append({"batch": batch, "query": q, "context": ctx, "ms": ms(uniform)})
    steps = (((1, 9, 16), (40, 70, 20), [[0], [1, 2]]), ((64, 1), (0, 90), [[0, 1]]))
    for queries, contexts, groups in steps:
        shape = StepShape.of(queries, contexts, groups)
        cells.append({"queries": list(queries), "contexts": list(contexts),
                      "groups": [list(g) for g in shape.groups], "ms": ms(shape)})  # fmt: skip
    assert FittedCost.fit(cells).coef == pytest.approx(coef, rel=1e-6, abs=1e-9)


def test_calibration_times_the_grid_and_the_mixed_steps(tiny, tmp_path, monkeypatch):
    calls = []

    def grid(adapter, queries, contexts, batches, repeats):
        calls.append("grid")
        return [{"batch": b, "query": q, "context": 32, "ms": 1.0 + b + q} for b in (1, 4) for q in (1, 8)]

    def mixed(adapter, contexts, repeats):
        calls.append("mixed")
        return [{"queries": [1, 9], "contexts": [30, 40], "groups": [[2, 9, 49]], "ms": 12.0}]

    key = profile_key(tiny.adapter, "tiny")
    assert key["calibration"] == CALIBRATION_KIND
    prof = calibrate(tiny.adapter, key, grid, mixed=mixed)
    assert calls == ["grid", "mixed"] and len(prof.cells) == 5 and prof.cells[-1]["queries"] == [1, 9]
    # a measured profile file names the step calibration (cost_profile=PATH calibrates with both)
    monkeypatch.setattr(cost_profile, "measure", grid)
    monkeypatch.setattr(cost_profile, "measure_mixed", mixed)
    path = tmp_path / "p.json"
    got = cost_profile.resolve_cost_profile(path, tiny.adapter, model_path=None, model_name="tiny")
    assert calls[2:] == ["grid", "mixed"] and FittedCost.load(path).key == got.key == key

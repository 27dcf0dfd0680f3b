"""``s2d2 bench-forward``: forward timings by query, context and batch, and projected speed-ups."""

from __future__ import annotations

import json

from conftest import assert_one_line_error, run_cli
from s2d2.cost import measure as forward_cost


def test_bench_forward_on_the_built_in_model(capsys, tmp_path):
    bench = {
        "runs": [
            {"name": "ar", "decoder": "ar", "nfe_per_token": 1.0, "query_tokens_per_forward": 2.0},
            {"name": "big", "decoder": "s2d2", "nfe_per_token": 0.25, "query_tokens_per_forward": 60.0},
        ]
    }
    (tmp_path / "results.json").write_text(json.dumps(bench))
    out_json = tmp_path / "cost.json"
    code, out, err = run_cli(
        capsys,
        "bench-forward",
        "--model",
        "tiny-gsm",
        "--query",
        "1,4,64",
        "--context",
        "32,128",
        "--batch",
        "1,2",
        "--repeats",
        "2",
        "--results",
        str(tmp_path / "results.json"),
        "--json",
        str(out_json),
    )
    assert code == 0, err
    cells = json.loads(out_json.read_text())["cells"]
    assert {(c["batch"], c["context"], c["query"]) for c in cells} == {
        (b, c, q) for b in (1, 2) for c in (32, 128) for q in (1, 4, 64)
    }
    assert all(c["ms"] > 0 for c in cells)
    proj = {p["name"]: p for p in json.loads(out_json.read_text())["projection"]}
    assert proj["ar"]["projected_speedup_vs_ar"] == 1.0
    t2 = forward_cost.interpolate(cells, 1, 32, 2.0)
    t60 = forward_cost.interpolate(cells, 1, 32, 60.0)
    assert proj["big"]["projected_speedup_vs_ar"] == round(1.0 * t2 / (0.25 * t60), 2)
    assert "projected wall speed-up" in out


def test_bench_forward_random_model_from_a_config(capsys, random_sdar_dir):
    code, out, err = run_cli(
        capsys,
        "bench-forward",
        "--config-json",
        str(random_sdar_dir / "config.json"),
        "--query",
        "1,8",
        "--context",
        "16",
        "--batch",
        "1,4",
        "--repeats",
        "1",
    )
    assert code == 0, err
    assert out.count("| 16 |") == 4  # 2 batches x 2 query lengths at context 16


def test_bench_forward_errors(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench-forward")
    assert_one_line_error(code, err, "--model", "--config-json")
    code, _, err = run_cli(capsys, "bench-forward", "--model", "tiny-gsm", "--query", "1,x")
    assert_one_line_error(code, err, "--query")
    (tmp_path / "bad.json").write_text("{")
    code, _, err = run_cli(capsys, "bench-forward", "--config-json", str(tmp_path / "bad.json"))
    assert_one_line_error(code, err, "bad.json")

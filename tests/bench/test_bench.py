"""``s2d2 bench``: grids, statistics, table, plots, output files and bad input.

The end-to-end test runs the quick grid on 3 problems with the built-in tiny-gsm model (skipped while
that model is not installed; ``S2D2_TEST_TINY_MODEL=/path/to/checkpoint`` points it at another tiny-gsm
checkpoint). Nothing here depends on accuracy.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_cli, tiny_model_path
from s2d2.bench.grid_run import run_bench
from s2d2.bench.grids import FAMILIES, GRIDS, BenchConfig
from s2d2.bench.outdir import OUTPUT_FILES
from s2d2.bench.report import TABLE_COLUMNS, pareto_frontier, plot_results, render_table
from s2d2.cli import main
from s2d2.config import DecodeConfig
from s2d2.errors import S2D2Error
from s2d2.intervals import wilson_interval

RUN_KEYS = {
    "name",
    "decoder",
    "config",
    "accuracy",
    "accuracy_ci95",
    "nfe_per_token",
    "syntax_error_rate",  # code suites; None on tiny-gsm
    "tokens_per_forward",
    "verify_rate",
    "acceptance_rate",
    "seconds_per_problem",
    "tokens_per_second",
    "speedup_nfe_vs_ar",
    "speedup_wall_vs_ar",
}
DIAGNOSTIC_KEYS = {
    "mean_accepted_per_verification",
    "full_accept_fraction",
    "fallback_commits_per_token",
    "nfe_per_token_by_kind",
    "query_tokens_per_forward",
    "query_tokens_per_token",
    "predraft_hit_rate",
}
TOP_KEYS = {"model", "suite", "split", "n", "max_num_seqs", "machine", "runs"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    from PIL import Image

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


# ---------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (0, 10, 0.0, 0.277533),
        (10, 10, 0.722467, 1.0),
        (5, 10, 0.236593, 0.763407),
        (47, 50, 0.837829, 0.979385),
    ],
)
def test_wilson_interval_known_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=1e-5)
    assert got[1] == pytest.approx(hi, abs=1e-5)
    assert 0.0 <= got[0] <= k / n <= got[1] <= 1.0


def test_wilson_interval_edges():
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_pareto_frontier_constructed_points():
    # (cost, accuracy): lower cost and higher accuracy are better
    pts = [
        (1.0, 0.95),  # 0 most accurate, most expensive: on the frontier
        (0.5, 0.90),  # 1 frontier
        (0.6, 0.85),  # 2 dominated by 1
        (0.3, 0.70),  # 3 frontier (cheapest)
        (0.5, 0.80),  # 4 same cost as 1, less accurate: dominated
        (0.9, 0.95),  # 5 as accurate as 0, cheaper: dominates 0
        (0.9, 0.95),  # 6 duplicate of 5: only the first is kept
        (float("nan"), 1.0),  # 7 ignored
    ]
    assert pareto_frontier(pts) == [3, 1, 5]
    assert pareto_frontier([]) == []
    assert pareto_frontier([(2.0, 0.1)]) == [0]
    # a single point that is both cheapest and best dominates everything
    assert pareto_frontier([(0.5, 0.5), (0.1, 0.9), (0.7, 0.8)]) == [1]


# ---------------------------------------------------------------------------------------------- grids


def test_grids_are_valid_and_named_uniquely():
    assert set(GRIDS) == {"default", "headline", "paper", "quick", "ucb", "code"}
    default = {c.name for c in GRIDS["default"]}
    assert {c.name for c in GRIDS["headline"]} <= default
    for name, grid in GRIDS.items():
        names = [c.name for c in grid]
        assert len(names) == len(set(names)), name
        assert sum(c.decoder == "ar" for c in grid) == 1, name
        for c in grid:
            assert c.decoder in FAMILIES
            cfg = DecodeConfig.build(**c.expanded(), max_new_tokens=64)  # validates
            assert cfg.decoder == c.decoder


def test_ucb_grid_sets_scope_and_reward():
    ucb = {c.name: DecodeConfig.build(**c.expanded()) for c in GRIDS["ucb"]}
    for b in (8, 16):
        assert ucb[f"s2d2-b{b}-always-strict"].policy == "always"
        paper = ucb[f"s2d2-b{b}-ucb-strict"]
        assert (paper.ucb_scope, paper.ucb_checked, paper.ucb_log_entropy) == ("request", False, False)
        engine = ucb[f"s2d2-b{b}-ucb-engine-strict"]
        assert (engine.ucb_scope, engine.ucb_checked, engine.ucb_log_entropy) == ("engine", True, True)
        committed = ucb[f"s2d2-b{b}-ucb-engine-committed-strict"]
        assert (committed.ucb_scope, committed.ucb_checked) == ("engine", False)


def test_default_grid_covers_the_issue():
    grid = GRIDS["default"]
    by = {c.name: c.expanded() for c in grid}
    fams = {c.decoder for c in grid}
    assert fams == set(FAMILIES)
    for b in (4, 8, 16):
        for tau in (0.5, 0.7, 0.9, 0.95, 0.99):
            assert by[f"dynamic-b{b}-t{tau:g}"]["threshold"] == tau
        assert {by[n]["steps"] for n in by if n.startswith(f"static-b{b}-")} == {b, b // 2, b // 4}
        s2d2 = [s for s in by.values() if s.get("decoder") == "s2d2" and s["block_size"] == b]
        policies = {(s["policy"], s.get("score"), s["acceptance"]) for s in s2d2}
        for acc in ("strict", "probabilistic"):
            for pol in ("always", "hysteresis", "min-span", "ucb"):
                assert any(p == pol and a == acc for p, _, a in policies), (b, pol, acc)
            for score in ("static", "dynamic"):
                assert ("score", score, acc) in policies, (b, score, acc)
        assert by[f"lossless-b{b}"]["preset"] == "lossless"
    routed = {n: s for n, s in by.items() if s.get("decoder") == "s2d2" and "preset" not in s}
    assert all(
        s["threshold"] == 0.9 and s["fallback"] == "dynamic" for n, s in routed.items() if "-fb" not in n
    )
    assert sum(bool(s.get("causal_cache")) and s["threshold"] >= 0.95 for s in routed.values()) >= 2
    assert sum(c.decoder == "eb" for c in grid) >= 3


def test_code_grid_compares_the_static_checks_with_score_routing_at_the_same_settings():
    code = {c.name: DecodeConfig.build(**c.expanded()) for c in GRIDS["code"]}
    assert [n for n in code if n.startswith("dynamic-b8-")] == [
        "dynamic-b8-t0.7",
        "dynamic-b8-t0.9",
        "dynamic-b8-t0.99",
    ]
    score, syntax, keys = (code[f"s2d2-b8-{r}-strict"] for r in ("score-static", "syntax", "syntax-keys"))
    assert (score.policy, syntax.policy, keys.policy) == ("score", "syntax", "syntax")
    assert not syntax.key_positions and keys.key_positions
    for c in (syntax, keys):  # the same score rule, block size and fallback as the score row
        assert c.replace(policy="score", key_positions=False) == score
    only, keys_only = code["s2d2-b8-syntax-only-strict"], code["s2d2-b8-syntax-keys-only-strict"]
    assert only.score_threshold == keys_only.score_threshold >= 1e6 and keys_only.key_positions
    assert {"lossless-b8", "lossless-auto", "ar"} <= set(code)
    assert not any(
        c.policy == "syntax" for c in (DecodeConfig.build(**x.expanded()) for x in GRIDS["default"])
    )


def test_quick_and_paper_grids():
    quick = {c.name: c for c in GRIDS["quick"]}
    assert [c.decoder for c in GRIDS["quick"]].count("s2d2") == 3
    pols = {c.expanded().get("policy") for c in quick.values() if c.decoder == "s2d2"}
    assert {"always", "score"} <= pols
    assert any(c.expanded().get("preset") == "lossless" for c in quick.values())
    paper = {c.name for c in GRIDS["paper"]}
    assert {"ar", "paper-sdar-a", "paper-sdar-b"} <= paper
    assert any(c.decoder == "dynamic" and c.expanded()["threshold"] == 0.85 for c in GRIDS["paper"])


# ------------------------------------------------------------------------------------------- table and plots


def fake_results() -> dict:
    def run(name, decoder, acc, nfe, sec, acc_rate=None, speed=None):
        return {
            "name": name,
            "decoder": decoder,
            "config": {"decoder": decoder},
            "accuracy": acc,
            "accuracy_ci95": list(wilson_interval(round(acc * 20), 20)),
            "nfe_per_token": nfe,
            "tokens_per_forward": 1 / nfe,
            "verify_rate": 0.0,
            "acceptance_rate": acc_rate,
            "seconds_per_problem": sec,
            "tokens_per_second": 34 / sec,
            "speedup_nfe_vs_ar": speed,
            "speedup_wall_vs_ar": speed,
        }

    runs = [
        run("ar", "ar", 0.95, 1.0, 0.2, speed=1.0),
        run("static-b4-s4", "static", 0.85, 1.0, 0.21, speed=1.0),
        run("dynamic-b8-t0.9", "dynamic", 0.9, 0.4, 0.09, speed=2.5),
        run("dynamic-b8-t0.99", "dynamic", 0.95, 0.45, 0.1, speed=2.2),
        run("eb-b8-g0.1", "eb", 0.8, 0.3, 0.07, speed=3.3),
        run("s2d2-b8-always-strict", "s2d2", 0.95, 0.43, 0.11, acc_rate=0.9, speed=2.3),
        run("s2d2-b8-score-static-strict", "s2d2", 0.93, 0.35, 0.08, acc_rate=0.85, speed=2.9),
    ]
    return {"model": "fake", "suite": "tiny-gsm", "split": "test", "n": 20, "machine": {}, "runs": runs}


def test_render_table_has_every_column_and_row():
    res = fake_results()
    text = render_table(res)
    header = next(line for line in text.splitlines() if line.startswith("| configuration"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells == list(TABLE_COLUMNS)
    for col in (
        "accuracy (95% CI)",
        "NFE/token",
        "tokens/forward",
        "verification rate",
        "acceptance rate",
        "s/problem",
        "tokens/s",
        "speed-up vs AR (NFE)",
        "speed-up vs AR (wall)",
    ):
        assert col in cells
    body = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| config")]
    assert len(body) == len(res["runs"])
    assert all(len(line.strip("|").split("|")) == len(TABLE_COLUMNS) for line in body)
    assert "0.950 [" in text and "1.00x" in text and " - " in text  # AR has no acceptance rate


def test_plots_are_valid_pngs(tmp_path):
    paths = plot_results(fake_results(), tmp_path)
    assert [p.name for p in paths] == ["accuracy_vs_nfe.png", "accuracy_vs_wall.png"]
    for p in paths:
        assert_png(p)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--grid", "huge"], ["unknown grid", "huge", "quick"]),
        (["--n", "0"], ["n must be", ">= 1"]),
        (["--n", "-3"], ["n must be"]),
        (["--suite", "gsm9k"], ["unknown suite", "gsm9k"]),
        (["--split", "valid"], ["unknown split", "valid"]),
        (["--n", "5000"], ["exceeds", "500 problems"]),
        (["--threads", "0"], ["--threads"]),
    ],
)
def test_bad_input_is_one_line(capsys, tmp_path, args, fragments):
    code, out, err = run_cli(capsys, "bench", "--out", str(tmp_path / "o"), *args)
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "o" / "results.json").exists()


def test_bad_model_and_out_are_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, "nope")
    afile = tmp_path / "file.txt"
    afile.write_text("mine")
    code, _, err = run_cli(capsys, "bench", "--out", str(afile))
    assert_one_line_error(code, err, "not a directory")
    assert afile.read_text() == "mine"


def test_run_bench_rejects_empty_input():
    with pytest.raises(S2D2Error, match="no problems"):
        run_bench(object(), [], "quick")
    with pytest.raises(S2D2Error, match="unknown grid"):
        run_bench(object(), [{"question": "q", "final": "1"}], "nope")
    with pytest.raises(S2D2Error, match="unique"):
        run_bench(object(), [{"question": "q", "final": "1"}], [BenchConfig("a"), BenchConfig("a")])


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_a_bench_run_does_not_inherit_engine_scoped_statistics():
    """Two runs of an engine-scoped UCB row on one model give the same figures (the run clears them)."""
    import s2d2
    from s2d2.bench.suites import load_problems

    model = s2d2.load("tiny-gsm", max_num_seqs=8)
    problems = load_problems("tiny-gsm", "dev", 24)
    ucb = GRIDS["ucb"]
    rows = [c for c in ucb if c.name in ("s2d2-b8-always-strict", "s2d2-b8-ucb-engine-committed-strict")]
    first, second = (run_bench(model, problems, rows, max_num_seqs=8)["runs"] for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert (a["accuracy"], a["nfe_per_token"], a["verify_rate"]) == (
            b["accuracy"],
            b["nfe_per_token"],
            b["verify_rate"],
        ), a["name"]
    assert model.engine.routing.total_pulls() > 0  # the second run learnt (and kept it for the caller)


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    path = tiny_model_path()
    if path is None:
        pytest.skip("the built-in tiny-gsm model is not installed yet (s2d2/models/tiny-gsm/config.json)")
    out = tmp_path_factory.mktemp("bench") / "out"
    out.mkdir()
    (out / "notes.txt").write_text("user file")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(
                [
                    "bench",
                    "--model",
                    str(path),
                    "--grid",
                    "quick",
                    "--n",
                    "3",
                    "--out",
                    str(out),
                    "--threads",
                    "1",
                    "--max-num-seqs",  # one problem at a time: the interleaved order checked below
                    "1",
                ]
            )
            code = 0
        except SystemExit as exc:
            code = exc.code
    assert code == 0, stderr.getvalue()
    return out, stdout.getvalue(), str(path)


def test_quick_results_schema(quick_run):
    out, _, model = quick_run
    res = json.loads((out / "results.json").read_text())
    assert set(res) == TOP_KEYS
    assert res["model"] == model and res["suite"] == "tiny-gsm" and res["split"] == "test" and res["n"] == 3
    assert isinstance(res["machine"], dict) and res["machine"]["torch_threads"] == 1
    assert [r["name"] for r in res["runs"]] == [c.name for c in GRIDS["quick"]]
    for r in res["runs"]:
        assert set(r) == RUN_KEYS | DIAGNOSTIC_KEYS, set(r) ^ (RUN_KEYS | DIAGNOSTIC_KEYS)
        assert r["decoder"] in {"ar", "static", "dynamic", "eb", "s2d2"}
        assert {"block_size", "steps", "max_new_tokens"} <= set(r["config"])
        assert r["config"]["max_new_tokens"] == 64
        assert 0.0 <= r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1] <= 1.0
        assert r["nfe_per_token"] > 0 and r["tokens_per_forward"] == pytest.approx(
            1 / r["nfe_per_token"], 1e-4
        )
        assert r["seconds_per_problem"] > 0 and r["tokens_per_second"] > 0
        assert r["speedup_nfe_vs_ar"] > 0 and r["speedup_wall_vs_ar"] > 0
        assert math.isfinite(r["fallback_commits_per_token"])
        if r["decoder"] == "s2d2" and r["config"]["policy"] == "always":  # routed ones may never verify
            assert r["verify_rate"] > 0 and 0.0 <= r["acceptance_rate"] <= 1.0
            assert 0.0 <= r["full_accept_fraction"] <= 1.0
            assert r["mean_accepted_per_verification"] >= 0.0
        elif r["decoder"] == "s2d2":
            assert r["acceptance_rate"] is None or 0.0 <= r["acceptance_rate"] <= 1.0
        else:
            assert r["verify_rate"] == 0.0 and r["acceptance_rate"] is None
    ar = next(r for r in res["runs"] if r["decoder"] == "ar")
    assert ar["speedup_nfe_vs_ar"] == 1.0 and ar["speedup_wall_vs_ar"] == 1.0
    assert ar["config"]["block_size"] == 1


def test_quick_table_pngs_and_records(quick_run):
    out, stdout, _ = quick_run
    header = next(line for line in stdout.splitlines() if line.startswith("| configuration"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(TABLE_COLUMNS)
    for c in GRIDS["quick"]:
        assert f"| {c.name} " in stdout
    for name in OUTPUT_FILES:
        assert (out / name).is_file(), name
    assert (out / "notes.txt").read_text() == "user file"  # other files in --out are left alone
    for png in out.glob("*.png"):
        assert_png(png)
    recs = [json.loads(line) for line in (out / "problems.jsonl").read_text().splitlines()]
    k = len(GRIDS["quick"])
    assert len(recs) == 3 * k
    assert {"config", "problem_id", "correct", "nfe", "tokens", "seconds"} <= set(recs[0])
    # interleaved: problem i runs every configuration, starting at configuration i mod K
    names = [c.name for c in GRIDS["quick"]]
    for i in range(3):
        chunk = recs[i * k : (i + 1) * k]
        assert len({r["problem_id"] for r in chunk}) == 1
        assert [r["config"] for r in chunk] == names[i:] + names[:i]

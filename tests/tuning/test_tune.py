"""``s2d2 tune`` end to end (3 trials on 10 problems), its preset in ``generate`` and ``bench``, and
resuming a study from its storage."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import run_cli, tiny_model_path

pytest.importorskip("optuna", reason="s2d2 tune needs optuna (pip install 's2d2[tune]')")
pytestmark = pytest.mark.skipif(
    tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed"
)


def _tune(capsys, tmp_path, out):
    return run_cli(
        capsys, "tune", "--n", "10", "--trials", "3", "--storage", f"sqlite:///{tmp_path / 'tune.db'}",
        "--out", str(out), "--threads", "1", "--no-progress",
    )  # fmt: skip


def _study_trials(tmp_path) -> int:
    import optuna

    (summary,) = optuna.get_all_study_summaries(storage=f"sqlite:///{tmp_path / 'tune.db'}")
    return summary.n_trials


def test_tune_writes_a_preset_used_by_generate_and_bench_and_resumes(capsys, tmp_path):
    from s2d2.presets import PRESET_FILE_KEYS, read_preset_file

    out = tmp_path / "tuned.json"
    code, stdout, err = _tune(capsys, tmp_path, out)
    assert code == 0, err
    assert "chosen trial" in stdout
    raw = json.loads(out.read_text())
    assert set(raw) == set(PRESET_FILE_KEYS)
    preset = read_preset_file(out)
    assert preset.settings["decoder"] == "s2d2" and preset.settings["block_size"] in (4, 8, 16)
    assert preset.tuned_on["n"] == 10 and preset.tuned_on["split"] == "dev" and preset.tuned_on["trials"] == 3
    assert 0 <= preset.ar["accuracy"] <= 1 and preset.ar["nfe_per_token"] > 0.9
    assert preset.dev["within_max_drop"] == (preset.dev["accuracy"] >= preset.ar["accuracy"] - 0.01 - 1e-9)
    assert out.with_suffix(".png").stat().st_size > 1000
    table = out.with_suffix(".md").read_text()
    assert "| AR |" in table and "<-" in table and table.count("\n| ") >= 4
    assert _study_trials(tmp_path) == 3

    # the preset file works wherever a preset name does: generate ...
    code, stdout, err = run_cli(capsys, "generate", "Tom has 3 apples.", "--preset", str(out), "--json")
    assert code == 0, err
    assert json.loads(stdout)["stats"]["generated_tokens"] > 0
    # ... and bench, as one more row named after the preset
    bench_dir = tmp_path / "bench"
    code, stdout, err = run_cli(
        capsys, "bench", "--grid", "quick", "--n", "2", "--preset", str(out), "--out", str(bench_dir),
        "--no-progress", "--threads", "1",
    )  # fmt: skip
    assert code == 0, err
    runs = {r["name"]: r for r in json.loads((bench_dir / "results.json").read_text())["runs"]}
    row = runs[preset.name]
    for key, value in preset.settings.items():
        assert row["config"][key] == value, key

    # a second invocation on the same storage resumes the study: 3 more trials, not a restart
    code, stdout, err = _tune(capsys, tmp_path, out)
    assert code == 0, err
    assert _study_trials(tmp_path) == 6
    assert read_preset_file(out).tuned_on["trials"] == 6
    assert read_preset_file(out).ar == preset.ar  # AR ran once: its figures come from the study


def test_tune_option_errors_are_one_line(capsys, tmp_path):
    from conftest import assert_one_line_error

    code, _, err = run_cli(capsys, "tune", "--out", str(tmp_path / "p.txt"))
    assert_one_line_error(code, err, "--out must be a .json file")
    code, _, err = run_cli(capsys, "tune", "--out", str(tmp_path / "p.json"), "--max-drop", "5")
    assert_one_line_error(code, err, "--max-drop")
    code, _, err = run_cli(capsys, "tune", "--out", str(tmp_path / "p.json"), "--task", "gsm8k")
    assert_one_line_error(code, err, "--data")


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2", "llada2"])
def test_search_space_keeps_request_scoped_ucb_and_never_fuses(family):
    """A tuned preset must keep batch == alone (no engine-scoped UCB) and the lossless-only settings off."""
    import optuna

    from s2d2.config import DecodeConfig
    from s2d2.tuning.space import SearchSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = SearchSpace(family=family)
    policies = set()
    for _ in range(300):
        s = space.suggest(study.ask())
        policies.add(s["policy"])
        assert s.get("ucb_scope", "request") == "request", s
        assert set(s) <= {f.name for f in dataclasses.fields(DecodeConfig)}, s
        if s.get("fuse"):  # fused verification only where it is valid (lossless family, 2L families)
            assert family != "fast_dllm_v2", s
            DecodeConfig.build(**s)
    assert "ucb" in policies  # the UCB branch was sampled, with its scope pinned

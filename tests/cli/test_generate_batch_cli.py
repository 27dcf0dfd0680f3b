"""Batched runs from the command line: ``s2d2 generate --input/--output`` and ``--max-num-seqs`` of
``s2d2 bench`` and ``s2d2 eval`` (``run_bench`` / ``run_eval``).

Every batched result must equal the same request decoded alone (the engine is batch invariant). The
tests use the built-in tiny-gsm model and are skipped while it is not installed
(``S2D2_TEST_TINY_MODEL=/path/to/checkpoint`` points them at another tiny-gsm checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import STAT_KEYS, assert_one_line_error, run_cli, tiny_model_path
from s2d2.errors import S2D2Error

TINY = tiny_model_path()
needs_tiny_model = pytest.mark.skipif(
    TINY is None, reason="the built-in tiny-gsm model is not installed yet (s2d2/models/tiny-gsm/config.json)"
)
Q1 = "Ben starts with 17 cookies. He sells 8 crates of 2 cookies. How many cookies does Ben have in the end?"
Q2 = "Priya starts with 111 shells. She gives 4 kids 11 shells each. How many shells does Priya have?"
Q3 = "There are 79 books on the table of Lily. She buys 7 bags with 6 books each. How many books now?"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny():
    if TINY is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    import s2d2

    return s2d2.load(TINY)


def generate_file(capsys, inp: Path, out: Path, *args: str) -> tuple[int, str, str]:
    return run_cli(capsys, "generate", "--model", str(TINY), "--input", str(inp), "--output", str(out), *args)


# ---------------------------------------------------------------------------------------------- --input


@needs_tiny_model
def test_input_file_equals_each_request_alone(tiny, capsys, tmp_path):
    ids = tiny.encode(Q3)
    lines = [
        {"id": "q1", "prompt": Q1},
        {"id": 7, "prompt_ids": ids, "decoder": "ar"},
        {"prompt": Q2, "preset": "lossless", "block_size": 8},
        {
            "id": "dyn",
            "prompt": Q3,
            "decoder": "dynamic",
            "block_size": 8,
            "threshold": 0.7,
            "max_new_tokens": 12,
        },
        {"id": "sampled", "prompt": Q1, "temperature": 0.8, "seed": 3},
    ]
    inp, out = write_jsonl(tmp_path / "prompts.jsonl", lines), tmp_path / "results.jsonl"
    code, _, err = generate_file(capsys, inp, out, "--max-new-tokens", "24", "--max-num-seqs", "4")
    assert code == 0, err
    rows = read_jsonl(out)
    assert len(rows) == len(lines)
    for line, row in zip(lines, rows, strict=True):
        if "id" in line:
            assert row["id"] == line["id"]
        else:
            assert "id" not in row
        settings = {k: v for k, v in line.items() if k not in ("id", "prompt", "prompt_ids")}
        settings.setdefault("max_new_tokens", 24)
        alone = tiny.generate(line.get("prompt", line.get("prompt_ids")), **settings)
        assert row["text"] == alone.text, line
        assert row["token_ids"] == alone.token_ids, line
        assert set(row["stats"]) >= STAT_KEYS
        cfg = tiny.make_config(**settings)
        if cfg.plan == "fixed" or cfg.fusion_blockers():  # a planned row's forwards depend on its batch
            assert row["stats"]["nfe"] == alone.stats.nfe, line
        assert row["stats"]["generated_tokens"] == len(row["token_ids"])
    assert rows[1]["stats"]["nfe_verify"] == 0  # the ar line ran as AR
    assert rows[3]["stats"]["generated_tokens"] <= 12  # its own max_new_tokens won over the flag
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@needs_tiny_model
@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"prompt": "a", "prompt_ids": [1]}', "exactly one"),
        ('{"id": 1}', "exactly one"),
        ('{"prompt": 5}', '"prompt" must be a string'),
        ('{"prompt_ids": [1, "x"]}', "list of integers"),
        ('{"prompt": "a", "colour": "red"}', "unknown key 'colour'"),
        ('{"prompt": "a", "block_size": "big"}', "'block_size' must be an integer"),
    ],
)
def test_malformed_line_writes_nothing(capsys, tmp_path, bad, fragment):
    inp = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": Q1}, {"prompt_ids": [5, 6]}, bad])
    out = tmp_path / "results.jsonl"
    code, _, err = generate_file(capsys, inp, out)
    assert code == 2
    assert_one_line_error(code, err, "prompts.jsonl line 3", fragment)
    assert not out.exists()
    out.write_text("previous results\n")  # an existing output is left as it was
    code, _, err = generate_file(capsys, inp, out)
    assert_one_line_error(code, err, "line 3")
    assert out.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "results.jsonl"]


@needs_tiny_model
def test_bad_setting_fails_only_its_request(tiny, capsys, tmp_path):
    lines = [{"id": "a", "prompt": Q1}, {"id": "b", "prompt": Q2, "threshold": 5}, {"prompt": Q3}]
    inp, out = write_jsonl(tmp_path / "prompts.jsonl", lines), tmp_path / "results.jsonl"
    code, _, err = generate_file(capsys, inp, out, "--max-new-tokens", "16")
    assert code == 1
    assert_one_line_error(code, err, "1 of 3 requests failed (lines 2)")
    rows = read_jsonl(out)
    assert rows[1]["id"] == "b" and set(rows[1]) == {"id", "error"}
    assert "threshold" in rows[1]["error"] and "\n" not in rows[1]["error"]
    for i in (0, 2):
        assert rows[i]["token_ids"] == tiny.generate(lines[i]["prompt"], max_new_tokens=16).token_ids


@needs_tiny_model
def test_output_equal_to_input_is_refused(capsys, tmp_path):
    inp = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": Q1}])
    before = inp.read_text()
    (tmp_path / "sub").mkdir()
    code, _, err = generate_file(capsys, inp, tmp_path / "sub" / ".." / "prompts.jsonl")
    assert_one_line_error(code, err, "is the input file")
    assert inp.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "sub"]


@needs_tiny_model
def test_prompt_xor_input(capsys, tmp_path):
    inp = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": Q1}])
    code, _, err = run_cli(capsys, "generate", Q1, "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert_one_line_error(code, err, "not both")
    code, _, err = run_cli(capsys, "generate")
    assert_one_line_error(code, err, "PROMPT")
    code, _, err = run_cli(capsys, "generate", "--input", str(inp))
    assert_one_line_error(code, err, "--output")
    code, _, err = run_cli(capsys, "generate", Q1, "--max-num-seqs", "0")
    assert_one_line_error(code, err, "--max-num-seqs")
    assert not (tmp_path / "o.jsonl").exists()


@needs_tiny_model
def test_plain_generate_accepts_max_num_seqs(tiny, capsys):
    code, out, err = run_cli(capsys, "generate", Q1, "--model", str(TINY), "--json", "--max-num-seqs", "2")
    assert code == 0, err
    assert json.loads(out)["token_ids"] == tiny.generate(Q1).token_ids


# ---------------------------------------------------------------------------------------------- bench


@needs_tiny_model
def test_bench_batched_equals_one_at_a_time(capsys, tmp_path):
    results = {}
    for n_seqs in (1, 4):
        out = tmp_path / f"seqs{n_seqs}"
        code, _, err = run_cli(
            capsys,
            "bench",
            "--model",
            str(TINY),
            "--grid",
            "quick",
            "--n",
            "6",
            "--max-num-seqs",
            str(n_seqs),
            "--out",
            str(out),
            "--threads",
            "1",
            "--no-progress",
        )
        assert code == 0, err
        results[n_seqs] = json.loads((out / "results.json").read_text())
        assert results[n_seqs]["max_num_seqs"] == n_seqs
        recs = read_jsonl(out / "problems.jsonl")
        assert len(recs) == 6 * len(results[n_seqs]["runs"])
        results[n_seqs]["answers"] = {(r["config"], r["problem_id"]): r["answer"] for r in recs}
    one, many = results[1], results[4]
    assert [r["name"] for r in one["runs"]] == [r["name"] for r in many["runs"]]
    for a, b in zip(one["runs"], many["runs"], strict=True):
        for key in ("accuracy", "nfe_per_token", "verify_rate", "acceptance_rate"):
            assert a[key] == b[key], (a["name"], key)
    assert one["answers"] == many["answers"]


def test_run_bench_checks_max_num_seqs():
    from s2d2.bench.grid_run import run_bench

    model = SimpleNamespace(tokenizer=object(), max_num_seqs=2, generate_batch=None)
    with pytest.raises(S2D2Error, match="max_num_seqs=4"):
        run_bench(model, [{"question": "q", "final": "1"}], "quick", max_num_seqs=4)
    with pytest.raises(S2D2Error, match="max_num_seqs"):
        run_bench(model, [{"question": "q", "final": "1"}], "quick", max_num_seqs=0)


# ---------------------------------------------------------------------------------------------- eval


@needs_tiny_model
@pytest.mark.parametrize("settings", [{}, {"decoder": "dynamic", "block_size": 8, "threshold": 0.7}])
def test_run_eval_batched_equals_one_at_a_time(tiny, settings):
    from s2d2.evaluation import get_task, run_eval

    task = get_task("tiny-gsm")
    problems = task.load(limit=6)
    cfg = tiny.make_config(max_new_tokens=48, **settings)
    one = run_eval(task, problems, tiny, config=cfg, progress=False)
    many = run_eval(task, problems, tiny, config=cfg, progress=False, max_num_seqs=4)
    assert [r.id for r in many.results] == [p["id"] for p in problems]
    # the model's default plans each step by its cost (plan="auto"): the same tokens, but forwards that
    # depend on the batch
    planned = cfg.plan == "auto" and not cfg.fusion_blockers()
    for a, b in zip(one.results, many.results, strict=True):
        assert (a.completion, a.correct, a.tokens) == (b.completion, b.correct, b.tokens)
        assert planned or a.nfe == b.nfe
        assert b.seconds > 0
    keys = ("n", "correct", "accuracy", "tokens")
    keys += () if planned else ("nfe", "verify_steps", "acceptance_rate")
    for key in keys:
        assert getattr(one.summary, key) == getattr(many.summary, key), key

"""The tiny-code task: generated functions, committed splits, the layout-aware tokenizer, scoring by
executed asserts, and the trainer on it."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from s2d2.evaluation.eval_loop import run_eval
from s2d2.evaluation.tasks import get_task
from s2d2.tasks.tiny_code.kinds import KINDS
from s2d2.tasks.tiny_code.problems import generate_problem
from s2d2.tasks.tiny_code.scoring import is_exact
from s2d2.tasks.tiny_code.splits import (
    SPLIT_SIZES,
    data_dir,
    iter_train_problems,
    load_split,
    question_hash,
    write_split_files,
)
from s2d2.tasks.tiny_code.tokenizer import build_tokenizer, tokenizer_dir


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def test_generator_is_deterministic_and_covers_every_kind():
    a = [generate_problem(random.Random(7)) for _ in range(3)]
    b = [generate_problem(random.Random(7)) for _ in range(3)]
    assert a == b
    kinds = Counter(p["kind"] for p in load_split("test"))
    assert set(kinds) == set(KINDS)
    for p in load_split("test"):
        assert 2 <= len(p["tests"]) <= 4 and all(
            t.startswith(f"assert {p['entry_point']}(") for t in p["tests"]
        )
        assert p["question"].startswith(f"def {p['entry_point']}(") and '"""' in p["question"]


def test_committed_splits_match_the_generator_and_are_disjoint(tmp_path):
    write_split_files(tmp_path)
    for name in ("test", "dev"):
        assert (tmp_path / f"{name}.jsonl").read_text() == (data_dir() / f"{name}.jsonl").read_text()
    assert len(load_split("test")) == SPLIT_SIZES["test"] >= 300
    test = {question_hash(p["question"]) for p in load_split("test")}
    dev = {question_hash(p["question"]) for p in load_split("dev")}
    assert len(test) == len(load_split("test")) and not test & dev
    stream = iter_train_problems(0)
    train = {question_hash(next(stream)["question"]) for _ in range(3000)}
    assert not train & (test | dev)


def test_tokenizer_is_exact_on_every_split_problem(tok):
    assert tok.get_vocab() == build_tokenizer(None).get_vocab()  # the committed files are the built ones
    for p in load_split("test") + load_split("dev"):
        for text in (p["question"], p["answer"]):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == text
    ids = tok.encode("\n    return x", add_special_tokens=False) + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "\n    return x"


def test_canonical_bodies_pass_and_wrong_ones_fail_in_the_sandbox(tmp_path):
    task = get_task("tiny-code")
    problems = task.load(limit=6)
    good = [p["answer"] for p in problems]
    bad = [p["answer"].replace("return", "return 1 +", 1) for p in problems]
    broken = [p["answer"] + ")" for p in problems]
    out = tmp_path / "r.jsonl"
    rep = run_eval(task, problems, completions=good, out=out, progress=False)
    assert rep.summary.accuracy == 1.0 and rep.summary.syntax_error_rate == 0.0
    summary = json.loads(out.with_name("r.summary.json").read_text())
    assert {"accuracy", "nfe_per_token", "syntax_error_rate"} <= set(summary)
    assert run_eval(task, problems, completions=bad, progress=False).summary.accuracy < 1.0
    rep = run_eval(task, problems, completions=broken, progress=False)
    assert rep.summary.accuracy == 0.0 and rep.summary.syntax_error_rate == 1.0
    assert all(r.error_kind == "syntax" and r.compiles is False for r in rep.results)


def test_math_tasks_have_no_syntax_error_rate():
    task = get_task("tiny-gsm")
    problems = task.load(limit=2)
    assert (
        run_eval(task, problems, completions=["#### 1", "2"], progress=False).summary.syntax_error_rate
        is None
    )


def test_dev_scoring_is_exact_match():
    p = load_split("dev")[0]
    assert is_exact(p["answer"] + "\n", p) and not is_exact(p["answer"] + " + 1", p)


def test_trainer_runs_on_tiny_code(tmp_path):
    from s2d2.training.loop import train_tiny

    best = train_tiny(1, tmp_path / "run", steps=2, dev_size=2, progress=False, task="tiny-code", threads=1)
    cfg = json.loads((best / "config.json").read_text())
    assert cfg["s2d2_task"] == "tiny-code" and (best / "tokenizer.json").is_file()
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["threads"] for r in log if r["kind"] == "train"] == [1]
    with pytest.raises(ValueError, match="hard-focus"):
        train_tiny(
            1, tmp_path / "run2", steps=1, dev_size=2, progress=False, task="tiny-code", hard_focus=0.5
        )

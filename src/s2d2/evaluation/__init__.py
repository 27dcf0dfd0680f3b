"""Benchmark evaluation: ``s2d2 eval`` (GSM8K, MBPP, HumanEval, tiny-gsm) and the lm-eval model ``s2d2``.

* :mod:`.tasks`: one class per benchmark: loading, prompting and scoring;
* :mod:`.answers`: answer extraction (numbers, code); :mod:`.records`: data files and hub datasets;
* :mod:`.sandbox`: runs generated code in a separate, resource-limited process;
* :mod:`.runner`: the evaluation loop, per-problem JSONL records and the summary;
* :mod:`.lm_eval_model`: the lm-evaluation-harness model (imports ``lm_eval``; import it explicitly).
"""

from __future__ import annotations

from .answers import extract_code, extract_gsm8k_answer, normalize_number
from .eval_loop import EvalReport, EvalSummary, ProblemResult, print_summary, run_eval, wilson_interval
from .sandbox import ExecResult, run_python
from .tasks import TASKS, Score, Task, get_task

__all__ = [
    "TASKS",
    "EvalReport",
    "EvalSummary",
    "ExecResult",
    "ProblemResult",
    "Score",
    "Task",
    "extract_code",
    "extract_gsm8k_answer",
    "get_task",
    "normalize_number",
    "print_summary",
    "run_eval",
    "run_python",
    "wilson_interval",
]

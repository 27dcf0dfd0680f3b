"""The evaluation loop: prompt, generate, score, record; then a summary with a 95% interval.

``run_eval`` takes any model object with the :meth:`s2d2.S2D2Model.generate` interface (``generate(prompt,
config, chat=...) -> result`` with ``.text`` and ``.stats``), or canned ``completions`` (then no model is
needed: useful to score outputs produced elsewhere, and to test the scorers).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..decoding.stats import GenerationStats
from ..errors import S2D2Error
from ..intervals import wilson_interval
from .tasks import Score, Task

__all__ = ["EvalReport", "EvalSummary", "ProblemResult", "run_eval", "wilson_interval", "print_summary"]


@dataclass
class ProblemResult:
    """One problem's record (one JSONL line of ``--out``)."""

    id: str
    task: str
    prompt: str
    completion: str
    #: The extracted answer (math) or code (code tasks); None if nothing could be extracted.
    extracted: str | None
    gold: str | None
    correct: bool
    error_kind: str | None
    error: str | None
    nfe: int
    tokens: int
    #: Generation wall time of this problem.
    seconds: float
    #: Time spent running the tests (code tasks).
    exec_seconds: float | None
    chat: bool
    stats: dict[str, Any] = field(default_factory=dict)
    #: Code tasks: whether the program compiles (None for other tasks).
    compiles: bool | None = None

    def to_json(self, is_code: bool) -> dict[str, Any]:
        d = asdict(self)
        if is_code:
            d["passed"] = self.correct
        return d


@dataclass
class EvalSummary:
    task: str
    model: str
    n: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    nfe: int
    tokens: int
    nfe_per_token: float
    tokens_per_forward: float
    verify_steps: int
    acceptance_rate: float
    #: Sum of per-problem generation times.
    gen_seconds: float
    #: Wall time of the whole run (generation + scoring).
    wall_seconds: float
    chat: bool
    config: dict[str, Any] | None
    errors: dict[str, int]
    #: Code tasks: the share of programs that do not compile (None for other tasks).
    syntax_error_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EvalReport:
    summary: EvalSummary
    results: list[ProblemResult]


def _completion_for(completions: Mapping[str, str] | Sequence[str], problem: dict, index: int) -> str:
    if isinstance(completions, Mapping):
        if problem["id"] not in completions:
            raise S2D2Error(f"no completion given for problem {problem['id']!r}")
        return completions[problem["id"]]
    if index >= len(completions):
        raise S2D2Error(f"{len(completions)} completions given for more problems")
    return completions[index]


def run_eval(
    task: Task,
    problems: list[dict],
    model: Any | None = None,
    *,
    config: Any | None = None,
    chat: bool | None = None,
    completions: Mapping[str, str] | Sequence[str] | None = None,
    out: str | Path | None = None,
    timeout: float | None = None,
    memory_mb: int | None = None,
    progress: bool = True,
    model_name: str | None = None,
    max_num_seqs: int = 1,
) -> EvalReport:
    """Evaluate ``model`` (or the canned ``completions``) on ``problems`` of ``task``.

    ``config``: the :class:`~s2d2.config.DecodeConfig` passed to every ``model.generate`` call (validated by
    the caller). ``chat``: wrap prompts in the chat template (None: the task's default for this model).
    ``out``: write one JSON line per problem as it finishes (and ``<out stem>.summary.json`` at the end).
    ``timeout`` / ``memory_mb``: sandbox limits of code tasks. ``max_num_seqs`` > 1: generate chunks of
    that many problems with one ``model.generate_batch`` call each (the same outputs; a problem's seconds
    are then the chunk's wall time / its size).
    """
    batched = _check_inputs(model, completions, max_num_seqs)
    if chat is None:
        chat = False if model is None else task.default_chat(model)
    sandbox = {k: v for k, v in (("timeout", timeout), ("memory_mb", memory_mb)) if v is not None}
    name = model_name or (getattr(model, "name", None) if model is not None else None) or "completions"
    source = _Completions(task, model, config, chat, completions, batched)
    out_path = None if out is None else Path(out).expanduser()
    start = time.perf_counter()
    with _Recorder(task, chat, sandbox, out_path, progress, len(problems)) as rec:
        step = max_num_seqs if batched else 1
        for first in range(0, len(problems), step):
            chunk = problems[first : first + step]
            for problem, row in zip(chunk, source.generate(first, chunk), strict=True):
                rec.record(problem, *row)
    summary = _summarize(task, str(name), rec, config, chat, time.perf_counter() - start)
    if out_path is not None:
        _write_summary(out_path, summary)
    return EvalReport(summary, rec.results)


def _check_inputs(model: Any | None, completions: Any, max_num_seqs: int) -> bool:
    """Whether the run generates in batches; a one-line error for inputs it cannot run with."""
    if model is None and completions is None:
        raise S2D2Error("run_eval needs a model or completions")
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise S2D2Error(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    batched = completions is None and max_num_seqs > 1
    if batched and not hasattr(model, "generate_batch"):
        raise S2D2Error(f"max_num_seqs={max_num_seqs} needs a model with generate_batch")
    return batched


#: One problem's (prompt, completion text, generation statistics, generation error or None).
_Row = tuple[str, str, GenerationStats, "str | None"]


@dataclass
class _Completions:
    """Where completions come from: the model (one problem a call, or a chunk a ``generate_batch`` call)
    or the canned ``completions``."""

    task: Task
    model: Any
    config: Any
    chat: bool
    completions: Mapping[str, str] | Sequence[str] | None
    batched: bool

    def generate(self, first: int, chunk: list[dict]) -> list[_Row]:
        """The rows of ``chunk``, whose first problem is problem ``first`` of the run."""
        prompts = [self.task.prompt(problem, self.chat) for problem in chunk]
        if self.completions is not None:
            return [
                (prompt, _completion_for(self.completions, problem, first + k), GenerationStats(), None)
                for k, (prompt, problem) in enumerate(zip(prompts, chunk, strict=True))
            ]
        if not self.batched:
            try:
                res = self.model.generate(prompts[0], self.config, chat=self.chat)
                return [(prompts[0], res.text, res.stats, None)]
            except S2D2Error as exc:  # e.g. a prompt too long for the model: record it, go on
                return [(prompts[0], "", GenerationStats(), str(exc))]
        t0 = time.perf_counter()
        outs = self.model.generate_batch(prompts, self.config, chat=self.chat, errors="return")
        share = (time.perf_counter() - t0) / len(chunk)
        return [
            (prompt, "", GenerationStats(), res.error)
            if res.error is not None
            else (prompt, res.text, replace(res.stats, seconds=share), None)
            for prompt, res in zip(prompts, outs, strict=True)
        ]


class _Recorder:
    """Scores each problem and keeps its record: the results, the summed statistics, the failure kinds,
    the ``--out`` JSONL file (written as problems finish) and the progress bar. A context manager: the
    file and the bar close on exit."""

    def __init__(
        self, task: Task, chat: bool, sandbox: dict[str, Any], out: Path | None, progress: bool, total: int
    ):
        self.task, self.chat, self.sandbox = task, chat, sandbox
        self.results: list[ProblemResult] = []
        self.totals = GenerationStats()
        self.errors: dict[str, int] = {}
        self.out_f = None
        if out is not None:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                self.out_f = open(out, "w", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
            except OSError as exc:
                raise S2D2Error(f"cannot write {out}: {exc}") from None
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=task.name, unit="problem", file=sys.stderr, dynamic_ncols=True)

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.out_f is not None:
            self.out_f.close()

    def record(
        self, problem: dict, prompt: str, text: str, stats: GenerationStats, gen_error: str | None
    ) -> None:
        task = self.task
        if gen_error is not None:
            score = Score(False, None, "generation_error", gen_error)
        else:
            score = task.score(problem, text, self.chat, **self.sandbox)
        self.totals.add(stats)
        r = ProblemResult(
            id=problem["id"],
            task=task.name,
            prompt=prompt,
            completion=text,
            extracted=score.extracted,
            gold=task.gold(problem),
            correct=bool(score.correct),
            error_kind=score.error_kind,
            error=score.error,
            nfe=stats.nfe,
            tokens=stats.generated_tokens,
            seconds=round(stats.seconds, 6),
            exec_seconds=None if score.exec_seconds is None else round(score.exec_seconds, 6),
            chat=self.chat,
            stats=stats.to_dict(),
            compiles=score.compiles,
        )
        self.results.append(r)
        if r.error_kind:
            self.errors[r.error_kind] = self.errors.get(r.error_kind, 0) + 1
        if self.out_f is not None:
            self.out_f.write(json.dumps(r.to_json(task.is_code)) + "\n")
            self.out_f.flush()
        if self.bar is not None:
            n_ok = sum(x.correct for x in self.results)
            self.bar.set_postfix(
                acc=f"{n_ok / len(self.results):.3f}", nfe_tok=f"{self.totals.nfe_per_token:.2f}"
            )
            self.bar.update(1)


def _summarize(task: Task, name: str, rec: _Recorder, config: Any, chat: bool, wall: float) -> EvalSummary:
    """The run's summary: accuracy with its Wilson interval, forwards and tokens, timings, failures."""
    n, totals = len(rec.results), rec.totals
    n_ok = sum(r.correct for r in rec.results)
    lo, hi = wilson_interval(n_ok, n)
    cfg = config.to_dict() if hasattr(config, "to_dict") else (dict(config) if config else None)
    return EvalSummary(
        task=task.name,
        model=name,
        n=n,
        correct=n_ok,
        accuracy=n_ok / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        nfe=totals.nfe,
        tokens=totals.generated_tokens,
        nfe_per_token=totals.nfe / totals.generated_tokens if totals.generated_tokens else 0.0,
        tokens_per_forward=totals.generated_tokens / totals.nfe if totals.nfe else 0.0,
        verify_steps=totals.verify_steps,
        acceptance_rate=totals.acceptance_rate,
        gen_seconds=totals.seconds,
        wall_seconds=wall,
        chat=chat,
        config=cfg,
        errors=dict(sorted(rec.errors.items())),
        syntax_error_rate=_syntax_error_rate(task, rec.results),
    )


def _syntax_error_rate(task: Task, results: list[ProblemResult]) -> float | None:
    """Code tasks: the share of problems whose program does not compile (a generation error counts as
    not compiling); None for other tasks or no problems."""
    if not task.is_code or not results:
        return None
    return sum(r.compiles is not True for r in results) / len(results)


def _write_summary(out: Path, summary: EvalSummary) -> None:
    """``<out stem>.summary.json`` beside the per-problem file."""
    summary_path = out.with_name(out.stem + ".summary.json")
    try:
        summary_path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise S2D2Error(f"cannot write {summary_path}: {exc}") from None


def print_summary(summary: EvalSummary, out: str | Path | None = None, file: Any = None) -> None:
    """The summary as a table (rich) on stdout (or ``file``)."""
    from rich.console import Console
    from rich.table import Table

    s = summary
    table = Table(title=f"{s.task} - {s.model}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("problems", str(s.n))
    table.add_row("accuracy", f"{100 * s.accuracy:.1f}% ({s.correct}/{s.n})")
    table.add_row("95% CI (Wilson)", f"[{100 * s.ci_low:.1f}%, {100 * s.ci_high:.1f}%]")
    table.add_row("NFE / token", f"{s.nfe_per_token:.3f}")
    if s.syntax_error_rate is not None:
        table.add_row("not compiling", f"{100 * s.syntax_error_rate:.1f}%")
    table.add_row("tokens / forward", f"{s.tokens_per_forward:.3f}")
    table.add_row("forwards (NFE)", str(s.nfe))
    table.add_row("generated tokens", str(s.tokens))
    table.add_row("verifications", str(s.verify_steps))
    table.add_row("acceptance rate", f"{s.acceptance_rate:.3f}")
    table.add_row("generation time", f"{s.gen_seconds:.1f} s ({s.gen_seconds / max(s.n, 1):.2f} s/problem)")
    table.add_row("wall time", f"{s.wall_seconds:.1f} s")
    table.add_row("chat template", "yes" if s.chat else "no")
    if s.config:
        c = s.config
        dec = f"{c.get('decoder')} B={c.get('block_size')}"
        if c.get("decoder") == "s2d2":
            dec += f" policy={c.get('policy')} fallback={c.get('fallback')}"
        table.add_row("decoder", dec)
    if s.errors:
        table.add_row("failures", ", ".join(f"{k}: {v}" for k, v in s.errors.items()))
    if out is not None:
        table.add_row("per-problem results", str(out))
    console = Console(file=file or sys.stdout, soft_wrap=True)
    console.print(table)

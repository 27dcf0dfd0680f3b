"""The ``s2d2`` command line.

Every user error (bad path, broken checkpoint, invalid settings, prompt too long) prints one line
``error: ...`` on stderr and exits with status 2, without a traceback. Set ``S2D2_DEBUG=1`` to see
tracebacks of unexpected failures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .errors import S2D2Error

app = typer.Typer(
    name="s2d2",
    help="Fast self-speculative decoding (S2D2) for block-diffusion language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# ---------------------------------------------------------------------------------------------- options
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Built-in model name or checkpoint directory.")]
DecoderOpt = Annotated[str | None, typer.Option(help="ar | static | dynamic | eb | s2d2")]
PresetOpt = Annotated[str | None, typer.Option(help="paper-sdar-a | paper-sdar-b | lossless | ...")]
BlockOpt = Annotated[int | None, typer.Option("--block-size", help="Block size B.")]
StepsOpt = Annotated[int | None, typer.Option(help="Denoising steps per block (default: one per position).")]
ThresholdOpt = Annotated[
    float | None, typer.Option(help="Confidence threshold tau (dynamic rule / fallback).")
]
PolicyOpt = Annotated[str | None, typer.Option(help="never | always | min-span | score | hysteresis | ucb")]
EstimatorOpt = Annotated[
    str | None,
    typer.Option(
        help="hard-margin | hard-entropy | confidence-power | clipped-margin | soft-entropy | renyi2"
    ),
]
MaxNewOpt = Annotated[int | None, typer.Option("--max-new-tokens", help="Most tokens to generate.")]
TempOpt = Annotated[float | None, typer.Option(help="Sampling temperature (0 = greedy).")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Top-k filter (0 = off).")]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Nucleus filter.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed.")]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu | cuda (default: cuda if available).")]
DtypeOpt = Annotated[
    str | None, typer.Option(help="bf16 | fp16 | fp32 (default: fp32 on CPU, bf16 on CUDA).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Any other decoding setting as NAME=VALUE (e.g. --set fallback=static). Repeatable."
    ),
]


def parse_sets(pairs: list[str] | None) -> dict[str, Any]:
    """``["penalty=2", "causal_cache=true"]`` -> typed settings (JSON values where they parse)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise S2D2Error(f"--set expects NAME=VALUE, got {pair!r}")
        key, raw = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


def decoding_settings(**kw: Any) -> dict[str, Any]:
    """Collect the explicitly given decoding flags (None = not given)."""
    sets = parse_sets(kw.pop("sets", None))
    settings = {k: v for k, v in kw.items() if v is not None}
    settings.update(sets)
    return settings


# ---------------------------------------------------------------------------------------------- generate
@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="Prompt text (or token ids with --ids).")],
    model: ModelOpt = "tiny-gsm",
    decoder: DecoderOpt = None,
    preset: PresetOpt = None,
    block_size: BlockOpt = None,
    steps: StepsOpt = None,
    threshold: ThresholdOpt = None,
    policy: PolicyOpt = None,
    estimator: EstimatorOpt = None,
    max_new_tokens: MaxNewOpt = None,
    temperature: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    seed: SeedOpt = None,
    chat: Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with text, ids and stats.")
    ] = False,
    ids: Annotated[
        bool, typer.Option("--ids", help="PROMPT is token ids separated by spaces or commas.")
    ] = False,
    trace: Annotated[bool, typer.Option(help="Include the per-step trace (with --json).")] = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    sets: SetOpt = None,
) -> None:
    """Generate a continuation of PROMPT and print it (with --json: text, token ids and statistics)."""
    from .model import load

    settings = decoding_settings(
        decoder=decoder,
        preset=preset,
        block_size=block_size,
        steps=steps,
        threshold=threshold,
        policy=policy,
        estimator=estimator,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        sets=sets,
    )
    if trace:
        settings["trace"] = True
    m = load(model, device=device, dtype=dtype)
    cfg = m.make_config(**settings)  # validate settings before any work
    if ids or m.tokenizer is None:
        try:
            prompt_in: Any = [int(t) for t in prompt.replace(",", " ").split()]
        except ValueError:
            raise S2D2Error(
                "PROMPT must be token ids (e.g. '17 42 101')"
                + ("" if ids else f": model {model} has no tokenizer")
            ) from None
    else:
        prompt_in = prompt
    result = m.generate(prompt_in, cfg, chat=chat)
    if as_json:
        out = result.to_dict()
        if trace and result.trace is not None:
            out["trace"] = [t.__dict__ for t in result.trace]
        typer.echo(json.dumps(out))
    else:
        typer.echo(result.text)
        s = result.stats
        typer.echo(
            f"[{s.generated_tokens} tokens, {s.nfe} forwards ({s.nfe_per_token:.2f}/token), "
            f"{s.verify_steps} verifications, {s.accepted}/{s.drafted} drafts accepted, {s.seconds:.2f} s]",
            err=True,
        )


# ---------------------------------------------------------------------------------------------- train-tiny
DEFAULT_TRAIN_STEPS = 4400  # keep in step with src/s2d2/models/tiny-gsm/MODEL_CARD.md


def _checked_option(flag: str, check, value):
    """``check(value)`` (None passes through); its ``ValueError`` becomes a one-line error naming ``flag``."""
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise S2D2Error(f"{flag}: {exc}") from None


@app.command("train-tiny")
def train_tiny_cmd(
    steps: Annotated[
        int,
        typer.Option(help="Optimiser-step cap (on 2 cores the 60-minute cap ends first, at about 3,100)."),
    ] = DEFAULT_TRAIN_STEPS,
    minutes: Annotated[
        float, typer.Option(help="Wall-clock cap in minutes (evaluations included); first to end wins.")
    ] = 60.0,
    out: Annotated[Path, typer.Option(help="Output directory (checkpoints, logs, best/).")] = Path(
        "runs/tiny-gsm"
    ),
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    resume: Annotated[bool, typer.Option(help="Resume from OUT/ckpt.pt if present.")] = True,
    dev_size: Annotated[
        int, typer.Option(help="Dev problems decoded per evaluation (checkpoint selection; >= 500 advised).")
    ] = 500,
    eval_every: Annotated[float, typer.Option(help="Minutes between dev evaluations.")] = 7.0,
    block_mix: Annotated[
        str | None,
        typer.Option(
            help="Block sizes to train and their weights as B=WEIGHT,... (e.g. '1=1' for AR mode only; "
            "default: the shipped recipe 2=.1,4=.3,8=.35,16=.25)."
        ),
    ] = None,
    ar_first: Annotated[
        float | None,
        typer.Option(
            help="Fraction of the budget trained in AR mode only (block size 1) before the block mix "
            "starts (default 0.5, the shipped recipe; 0 = mix from the start; a resumed run keeps its "
            "own value unless given)."
        ),
    ] = None,
    compile: Annotated[
        bool,
        typer.Option(
            help="Train through torch.compile: 3-6% more steps per minute in a 60-minute run on 2 CPU "
            "cores, after a warm-up of about 2 minutes that counts against the budget (a wash at 60 "
            "minutes); falls back to eager if compilation fails."
        ),
    ] = False,
    lr: Annotated[
        float | None,
        typer.Option(
            help="Peak learning rate of the warm-up + cosine schedule (default 2e-3, the shipped recipe; "
            "a resumed run keeps its own unless given)."
        ),
    ] = None,
    ema: Annotated[
        float | None,
        typer.Option(
            help="Decay of an exponential moving average of the weights, which is then what gets "
            "evaluated and saved to OUT/best (default 0.995, the shipped recipe; 0 = off, evaluate the live "
            "weights; a resumed run keeps its own unless given)."
        ),
    ] = None,
    hard_focus: Annotated[
        float | None,
        typer.Option(
            help="In [0, 1): thin out training problems whose additions and subtractions carry or borrow "
            "in fewer than two digit columns (kept with probability 1 - F for none, 1 - F/2 for one), so "
            "that the steps the model gets wrong most are seen more (default 0.6, the shipped recipe; "
            "0 = the natural distribution, as the test split has it; a resumed run keeps its own unless "
            "given)."
        ),
    ] = None,
) -> None:
    """Train the built-in tiny-gsm model from scratch (CPU); the selected model lands in OUT/best/.

    Stops after STEPS optimiser steps or MINUTES of wall-clock time, whichever comes first; a killed run
    resumes from OUT/ckpt.pt. Evaluates greedy AR and dynamic B=8 decoding on DEV_SIZE dev problems and
    keeps the checkpoint with the best sum of the two accuracies.
    """
    from .tasks.tiny_gsm import check_hard_focus
    from .training.tiny import check_ar_first, check_ema, check_lr, parse_block_mix, train_tiny

    if minutes <= 0:
        raise S2D2Error(f"--minutes must be > 0, got {minutes}")
    if steps < 1:
        raise S2D2Error(f"--steps must be >= 1, got {steps}")
    if dev_size < 1 or eval_every <= 0:
        raise S2D2Error("--dev-size must be >= 1 and --eval-every > 0")
    if out.exists() and not out.is_dir():
        raise S2D2Error(f"--out {out} exists and is not a directory")
    mix = _checked_option("--block-mix", parse_block_mix, block_mix)
    ar_first = _checked_option("--ar-first", check_ar_first, ar_first)
    lr = _checked_option("--lr", check_lr, lr)
    ema = _checked_option("--ema", check_ema, ema)
    hard_focus = _checked_option("--hard-focus", check_hard_focus, hard_focus)
    best = train_tiny(
        minutes=minutes,
        out=out,
        seed=seed,
        steps=steps,
        resume=resume,
        dev_size=dev_size,
        eval_every_minutes=eval_every,
        block_mix=mix,
        ar_first=ar_first,
        compile=compile,
        lr=lr,
        ema=ema,
        hard_focus=hard_focus,
    )
    typer.echo(f"best model: {best}")


# ---------------------------------------------------------------------------------------------- other modules
# Commands implemented in their own modules register here, one line each (keep their imports light).
from .bench import bench_command  # noqa: E402

app.command("bench")(bench_command)
from .evaluation.cli import eval_command, lm_eval_command  # noqa: E402

app.command("eval")(eval_command)
app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)(lm_eval_command)


# ---------------------------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["--help"]
    try:
        app(args=argv, standalone_mode=False)
    except S2D2Error as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(getattr(exc, "exit_code", getattr(exc, "code", 0)))
    except Exception as exc:
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # usage error from the CLI parser
            typer.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        # a bug, not the user's fault: still one line unless debugging
        if os.environ.get("S2D2_DEBUG"):
            raise
        typer.echo(
            f"error: unexpected failure: {exc.__class__.__name__}: {exc} (set S2D2_DEBUG=1 for a traceback)",
            err=True,
        )
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()

"""The ``s2d2`` command line (a package the library never imports).

One module per command (:mod:`.generate`, :mod:`.train_tiny`, :mod:`.bench`, :mod:`.evaluate`); what
they share is in :mod:`.options`. The command modules import the library's heavy parts inside their
functions, so ``s2d2 --help`` stays fast.

Every user error (bad path, broken checkpoint, invalid settings, prompt too long) prints one line
``error: ...`` on stderr and exits with status 2, without a traceback. Set ``S2D2_DEBUG=1`` to see
tracebacks of unexpected failures.
"""

from __future__ import annotations

import os
import sys
import warnings

import typer

from ..errors import S2D2Error
from .bench import bench_command
from .bench_batch import bench_batch_command
from .bench_forward import bench_forward_command
from .evaluate import eval_command, lm_eval_command
from .generate import generate_command
from .info import info_command
from .serve import bench_serve_command, serve_command
from .trace import trace_command
from .train_tiny import train_tiny_command
from .tune import tune_command

__all__ = ["app", "main"]

app = typer.Typer(
    name="s2d2",
    help="Fast self-speculative decoding (S2D2) for block-diffusion language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Registration order is the order of ``s2d2 --help``.
app.command("generate")(generate_command)
app.command("train-tiny")(train_tiny_command)
app.command("bench")(bench_command)
app.command("bench-batch")(bench_batch_command)
app.command("bench-forward")(bench_forward_command)
app.command("eval")(eval_command)
app.command("serve")(serve_command)
app.command("bench-serve")(bench_serve_command)
app.command("tune")(tune_command)
app.command("trace")(trace_command)
app.command("info")(info_command)
app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)(lm_eval_command)


def _one_line_warning(message: Warning | str, category: type[Warning], *args: object, **kw: object) -> str:
    """Warnings on the command line read ``warning: ...`` (one line, no source location)."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> None:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); exits with the command's status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["--help"]
    warnings.formatwarning = _one_line_warning
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

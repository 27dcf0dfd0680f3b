"""What several ``s2d2`` commands share: option types, ``--set`` parsing and option checks.

The aliases are ``Annotated`` types; typer reads them when the command line is built, so a command
module imports them at its top (they must be in the module's globals, as its annotations are postponed).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from ..errors import S2D2Error

T = TypeVar("T")
R = TypeVar("R")

# ---------------------------------------------------------------------------------------------- model
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="Built-in model name, checkpoint directory or Hugging Face repository ORG/NAME."
    ),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision",
        help="With a Hugging Face repository as --model: the branch, tag or commit (default: main).",
        show_default=False,
    ),
]
GenerationConfigOpt = Annotated[
    str,
    typer.Option(
        "--generation-config",
        help="auto: the checkpoint's generation_config.json sampling fields (temperature, top_k, top_p, "
        "min_p, repetition_penalty) are the defaults of a request that omits them | vllm or off: s2d2's "
        "own defaults | a folder holding generation_config.json (as vLLM's flag).",
    ),
]
LoadBlockOpt = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        help="The block size the model runs with when a request sets none (default: the config's, a -bN "
        "suffix of the model's name, or the family's published one).",
        show_default=False,
    ),
]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu | cuda (default: cuda if available).")]
DtypeOpt = Annotated[
    str | None, typer.Option(help="bf16 | fp16 | fp32 (default: fp32 on CPU, bf16 on CUDA).")
]
EnforceEagerOpt = Annotated[
    bool,
    typer.Option("--enforce-eager", help="Run every forward eagerly: no CUDA graphs (as vLLM's flag)."),
]
TensorParallelOpt = Annotated[
    int,
    typer.Option(
        "--tensor-parallel-size", "-tp",
        help="Split the model over this many processes (one GPU each on CUDA) by heads, columns, "
        "vocabulary and experts (as vLLM's flag; 1: this process alone). With bench-batch --simulate "
        "roofline:NAME it prices the projected forward on N GPUs of one NVLink node instead.",
    ),
]  # fmt: skip
ExecutorBackendOpt = Annotated[
    str,
    typer.Option(
        "--distributed-executor-backend",
        help="How the tensor-parallel ranks run: mp (spawned processes on this machine) | ray (Ray actors).",
    ),
]


def parallel_options(tensor_parallel_size: int, backend: str) -> dict[str, Any]:
    """``s2d2.load``'s parallel settings from the flags (none when they are the defaults)."""
    if tensor_parallel_size == 1 and backend == "mp":
        return {}
    return {"tensor_parallel_size": tensor_parallel_size, "distributed_executor_backend": backend}


# ---------------------------------------------------------------------------------------------- decoding
DecoderOpt = Annotated[str | None, typer.Option(help="ar | static | dynamic | eb | s2d2")]
PresetOpt = Annotated[
    str | None,
    typer.Option(help="A named preset (paper-sdar-a | paper-sdar-b | lossless | ...) or a PRESET.json file."),
]
BlockOpt = Annotated[int | None, typer.Option("--block-size", help="Block size B.")]
StepsOpt = Annotated[int | None, typer.Option(help="Denoising steps per block (default: one per position).")]
ThresholdOpt = Annotated[
    float | None, typer.Option(help="Confidence threshold tau (dynamic rule / fallback).")
]
PolicyOpt = Annotated[
    str | None, typer.Option(help="never | always | min-span | score | hysteresis | ucb | syntax")
]
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
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Any other decoding setting as NAME=VALUE (e.g. --set fallback=static). Repeatable."
    ),
]

# ---------------------------------------------------------------------------------------------- runs
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar on stderr.")]
MaxNumSeqsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-seqs", help="Most rows the batched engine decodes together (default: the library's)."
    ),
]


def check_at_least(flag: str, value: float | None, minimum: float) -> None:
    """A one-line error unless ``value`` (None: not given) is at least ``minimum``."""
    if value is not None and value < minimum:
        raise S2D2Error(f"{flag} must be >= {minimum}, got {value}")


def check_above(flag: str, value: float, bound: float) -> None:
    """A one-line error if ``value`` is at most ``bound``."""
    if value <= bound:
        raise S2D2Error(f"{flag} must be > {bound}, got {value}")


def check_kv_options(page_size: int, budget: int | None) -> None:
    """``--kv-page-size`` >= 1 and ``--kv-budget-tokens`` (when given) at least one page."""
    check_at_least("--kv-page-size", page_size, 1)
    if budget is not None and budget < page_size:
        raise S2D2Error(
            f"--kv-budget-tokens must hold at least one page ({page_size} positions), got {budget}"
        )


def check_max_num_seqs(value: int | None) -> int | None:
    """``--max-num-seqs`` must be an integer >= 1 (None = not given)."""
    check_at_least("--max-num-seqs", value, 1)
    return value


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


def checked_option(flag: str, check: Callable[[T], R], value: T | None) -> R | None:
    """``check(value)`` (None passes through); its ``ValueError`` becomes a one-line error naming ``flag``."""
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise S2D2Error(f"{flag}: {exc}") from None


def require_modules(*modules: str, hint: str) -> None:
    """A one-line error ``hint`` (how to install them) unless every one of ``modules`` imports."""
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError:
        raise S2D2Error(hint) from None

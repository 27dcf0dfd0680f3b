"""What several ``s2d2`` commands share: option types and groups of options, option checks, ``--set``
parsing, and loading the model from the common options.

The aliases are ``Annotated`` types; typer reads them when the command line is built, so a command
module imports them at its top (they must be in the module's globals, as its annotations are postponed).
A group (:class:`DecodingFlags`, :class:`DeviceFlags`, :class:`ParallelFlags`, or a command's own) is a
dataclass of such options that a command wrapped in :func:`option_groups` takes as one keyword-only
parameter: typer sees the group's options, in their order, at that parameter's place.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import typing
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



# ---------------------------------------------------------------------------------------------- decoding
PresetOpt = Annotated[
    str | None,
    typer.Option(help="A named preset (paper-sdar-a | paper-sdar-b | lossless | ...) or a PRESET.json file."),
]
MaxNewOpt = Annotated[int | None, typer.Option("--max-new-tokens", help="Most tokens to generate.")]
PromptChatOpt = Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Any other decoding setting as NAME=VALUE (e.g. --set fallback=static). Repeatable."
    ),
]

# ---------------------------------------------------------------------------------------------- runs
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar on stderr.")]
ThreadsOpt = Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's own choice).")]
PageSizeOpt = Annotated[int, typer.Option("--kv-page-size", help="Positions one KV page holds.")]
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


def int_list(text: str, flag: str) -> list[int]:
    """The comma-separated integers of option ``flag``'s ``text``; a one-line error if none or not all."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise S2D2Error(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values:
        raise S2D2Error(f"{flag} is empty")
    return values


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


def checked_option(flag: str, check: Callable[[T], R], value: T | None) -> R | None:
    """``check(value)`` (None passes through); its ``ValueError`` becomes a one-line error naming ``flag``."""
    if value is None:
        return None
    try:
        return check(value)
    except ValueError as exc:
        raise S2D2Error(f"{flag}: {exc}") from None


# ---------------------------------------------------------------------------------------------- groups
@dataclasses.dataclass(frozen=True)
class DecodingFlags:
    """The decoding flags of the commands that decode prompts (None: not given)."""

    decoder: Annotated[str | None, typer.Option(help="ar | static | dynamic | eb | s2d2")] = None
    preset: PresetOpt = None
    block_size: Annotated[int | None, typer.Option("--block-size", help="Block size B.")] = None
    steps: Annotated[
        int | None, typer.Option(help="Denoising steps per block (default: one per position).")
    ] = None
    threshold: Annotated[
        float | None, typer.Option(help="Confidence threshold tau (dynamic rule / fallback).")
    ] = None
    policy: Annotated[
        str | None, typer.Option(help="never | always | min-span | score | hysteresis | ucb | syntax")
    ] = None
    estimator: Annotated[
        str | None,
        typer.Option(
            help="hard-margin | hard-entropy | confidence-power | clipped-margin | soft-entropy | renyi2"
        ),
    ] = None
    max_new_tokens: MaxNewOpt = None
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (0 = greedy).")] = None
    top_k: Annotated[int | None, typer.Option("--top-k", help="Top-k filter (0 = off).")] = None
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus filter.")] = None
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None

    def settings(self, sets: list[str] | None) -> dict[str, Any]:
        """The given flags and the ``--set`` pairs as decoding settings (a ``--set`` wins)."""
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return {**given, **parse_sets(sets)}


@dataclasses.dataclass(frozen=True)
class DeviceFlags:
    """``--device`` and ``--dtype``: where the model runs and in which precision (None: the default)."""

    device: DeviceOpt = None
    dtype: DtypeOpt = None


@dataclasses.dataclass(frozen=True)
class ParallelFlags:
    """``-tp`` and ``--distributed-executor-backend``: how the model is split over processes."""

    tensor_parallel_size: TensorParallelOpt = 1
    distributed_executor_backend: ExecutorBackendOpt = "mp"

    def load_options(self) -> dict[str, Any]:
        """``s2d2.load``'s parallel settings (none when they are the defaults)."""
        if self.tensor_parallel_size == 1 and self.distributed_executor_backend == "mp":
            return {}
        return dataclasses.asdict(self)


def option_groups(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` as typer should see it: each parameter annotated with a dataclass (a group) is spread
    into the group's fields, in their order and at its place, each an option of its own; a call gathers
    them back into one instance of the group."""
    hints = typing.get_type_hints(command, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY  # typer calls a command with keywords
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for param in inspect.signature(command).parameters.values():
        kind = hints[param.name]
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            params.append(param.replace(annotation=kind, kind=keyword))
            continue
        fields = dataclasses.fields(kind)
        types = typing.get_type_hints(kind, include_extras=True)
        groups[param.name] = (kind, [f.name for f in fields])
        params += [inspect.Parameter(f.name, keyword, default=f.default, annotation=types[f.name])
                   for f in fields]  # fmt: skip

    @functools.wraps(command)
    def run(**options: Any) -> None:
        for name, (kind, names) in groups.items():
            options[name] = kind(**{n: options.pop(n) for n in names})
        command(**options)

    run.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


# ---------------------------------------------------------------------------------------------- loading
def set_threads(threads: int | None) -> None:
    """torch's CPU thread count from ``--threads`` (None: torch's own choice)."""
    check_at_least("--threads", threads, 1)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def load_model(
    model: str, placement: DeviceFlags, *, threads: int | None = None, freeze: bool = False, **options: Any
) -> Any:
    """``s2d2.load`` of ``model`` on ``--device`` and ``--dtype`` with ``options`` (its keywords), after
    ``--threads``; ``freeze``: then :func:`~s2d2.model.freeze_loaded_heap` (a command that decodes for
    long)."""
    from ..model import freeze_loaded_heap, load

    set_threads(threads)
    m = load(model, device=placement.device, dtype=placement.dtype, **options)
    if freeze:
        freeze_loaded_heap()
    return m


def require_modules(*modules: str, hint: str) -> None:
    """A one-line error ``hint`` (how to install them) unless every one of ``modules`` imports."""
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError:
        raise S2D2Error(hint) from None

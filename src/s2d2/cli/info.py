"""``s2d2 info MODEL [--json]``: what s2d2 will do with a checkpoint, from its side files alone.

It reads ``config.json``, ``generation_config.json``, the tokenizer's side files, the chat template and
the weight index (or a safetensors file's header), never the weights, offline (a directory, or a Hub
repository already in the cache), and never reads stdin. The report's keys: ``family``, ``architecture``,
``block_size`` and ``block_size_source``, ``mask_token_id``, ``stop_token_ids``, ``tool_call_parser``,
``reasoning_parser``, ``generation_defaults``, ``parameters`` (counted from the config), ``weights``
(``files``, ``tensors``, and the ``missing`` / ``unexpected`` tensor names: the index's against the
names the family reads), ``tensor_parallel_size`` and ``bytes_per_rank`` (the weights one rank holds at
that size, in the config's dtype).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import S2D2Error
from .options import GenerationConfigOpt, LoadBlockOpt, RevisionOpt

ModelArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint directory or cached Hugging Face repository ORG/NAME.", show_default=False
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")]
TpOpt = Annotated[
    int, typer.Option("--tensor-parallel-size", "-tp", "--tp", help="Ranks the weights are split over.")
]
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


def weight_names(path: Path) -> tuple[int, list[str]]:
    """The checkpoint's shard count and tensor names: its index, else its safetensors files' headers."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise S2D2Error(f"{index} is not a valid safetensors index ({exc})") from None
        return len(set(weight_map.values())), list(weight_map)
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    names: list[str] = []
    for f in files:
        with safe_open(str(f), "pt") as handle:  # the header only
            names += list(handle.keys())
    return len(files), names


def checkpoint_report(
    path: Path, *, name: str, tp: int, block_size: int | None, generation_config: str
) -> dict:
    """The report of the module docstring for checkpoint directory ``path``."""
    from ..cost.model_shape import ModelShape
    from ..families import detect_family
    from ..families.checkpoint_facts import resolve_facts
    from ..families.sharding import split_problem
    from ..families.side_files import read_side_files
    from ..serving.reasoning.detect import detect_reasoning_parser
    from ..serving.tools.formats import detect_format

    side = read_side_files(path)
    config = side.config
    fam = detect_family(config, path)
    facts = resolve_facts(side, fam.SPEC.rules, block_size_option=block_size, name=name,
                          generation_config=generation_config)  # fmt: skip
    problem = split_problem(config, tp)
    if problem:
        raise S2D2Error(problem)
    files, names = weight_names(path)
    expected = set(fam.SPEC.tensor_names(config))
    shape = ModelShape.from_config(config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    template = side.chat_template
    return {
        "family": fam.FAMILY,
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "block_size": facts.block_size,
        "block_size_source": facts.block_size_source,
        "mask_token_id": facts.mask_token_id,
        "stop_token_ids": facts.stop_token_ids,
        "tool_call_parser": detect_format(template).name if template else None,
        "reasoning_parser": detect_reasoning_parser(template),
        "generation_defaults": facts.generation_defaults,
        "parameters": int(shape.total_params),
        "weights": {
            "files": files,
            "tensors": len(names),
            "missing": sorted(expected - set(names)),
            "unexpected": sorted(set(names) - expected),
        },
        "tensor_parallel_size": tp,
        "bytes_per_rank": int(shape.held_params(tp) * _DTYPE_BYTES.get(dtype, 2)),
    }


def _size(n: float, units: tuple[str, ...], step: int) -> str:
    """``n`` in the largest of ``units`` (each ``step`` times the one before) that keeps it >= 1."""
    i = 0
    while n >= step and i < len(units) - 1:
        n, i = n / step, i + 1
    return f"{n:.2f} {units[i]}".replace(".00 ", " ")


def _table(report: dict[str, Any], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    w, defaults, tp = report["weights"], report["generation_defaults"], report["tensor_parallel_size"]
    params = report["parameters"]

    def some(names: list[str]) -> str:
        return f"{len(names)}" + (f" (e.g. {names[0]})" if names else "")

    table = Table(title=f"s2d2 info {model}", show_header=False)
    rows = [
        ("family", f"{report['family']} ({report['architecture']})"),
        ("block size", f"{report['block_size']} ({report['block_size_source']})"),
        ("mask token id", str(report["mask_token_id"])),
        ("stop token ids", ", ".join(map(str, report["stop_token_ids"])) or "none"),
        ("tool-call parser", str(report["tool_call_parser"])),
        ("reasoning parser", str(report["reasoning_parser"])),
        ("generation defaults", ", ".join(f"{k}={v}" for k, v in defaults.items()) or "none"),
        ("parameters", f"{params:,} ({_size(params, ('', 'K', 'M', 'B'), 1000)})"),
        ("weights", f"{w['tensors']:,} tensors in {w['files']} files; missing {some(w['missing'])}; "
                    f"unexpected {some(w['unexpected'])}"),
        (f"bytes per rank (tp {tp})", _size(report["bytes_per_rank"], ("B", "KiB", "MiB", "GiB"), 1024)),
    ]  # fmt: skip
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def info_command(
    model: ModelArg,
    as_json: JsonOpt = False,
    tensor_parallel_size: TpOpt = 1,
    block_size: LoadBlockOpt = None,
    generation_config: GenerationConfigOpt = "auto",
    revision: RevisionOpt = None,
) -> None:
    """Show what s2d2 reads from MODEL's side files (no weights, offline): family, block size, mask and stop
    ids, parsers, generation defaults, parameters and the weight index's tensors."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # side files only, from the cache: never a download
    from ..model_source import resolve_model_path

    path = resolve_model_path(model, revision)
    report = checkpoint_report(path, name=model, tp=tensor_parallel_size, block_size=block_size,
                               generation_config=generation_config)  # fmt: skip
    if as_json:
        typer.echo(json.dumps(report))
    else:
        _table(report, model)

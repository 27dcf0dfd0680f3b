"""``s2d2 bench-forward``: milliseconds per forward by query, context and batch (:mod:`s2d2.cost.measure`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..cost.step_cost import FittedCost, profile_key
from ..errors import S2D2Error
from .options import DeviceFlags, EnforceEagerOpt, RevisionOpt, int_list, load_model, option_groups


@option_groups
def bench_forward_command(
    *,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Built-in name, checkpoint directory or Hugging Face ORG/NAME."),
    ] = None,
    config_json: Annotated[
        Path | None, typer.Option("--config-json", help="A config.json: time a random model of that shape.")
    ] = None,
    query: Annotated[str, typer.Option(help="Query tokens per row.")] = "1,4,16,32,64,128,256",
    context: Annotated[str, typer.Option(help="Cached positions per row.")] = "128,1024,4096",
    batch: Annotated[str, typer.Option(help="Rows per forward.")] = "1,8,32",
    repeats: Annotated[int, typer.Option(help="Timed forwards per cell (median).")] = 5,
    results: Annotated[
        Path | None, typer.Option(help="A bench results.json: project its configurations' wall speed-ups.")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the table here.")] = None,
    placement: DeviceFlags,
    revision: RevisionOpt = None,
    enforce_eager: EnforceEagerOpt = False,
) -> None:
    """Time one batched forward for every (batch, context, query) cell of a checkpoint or of a random model
    built from a config, and (with --results) project each bench configuration's wall speed-up vs AR
    from its NFE/token and query tokens per forward."""
    import torch
    from tqdm.auto import tqdm

    from ..cost import measure as forward_cost

    if (model is None) == (config_json is None):
        raise S2D2Error("give exactly one of --model and --config-json")
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    qs, cs, bs = int_list(query, "--query"), int_list(context, "--context"), int_list(batch, "--batch")
    if min(qs + cs + bs) < 1 or repeats < 1:
        raise S2D2Error("--query, --context, --batch and --repeats take integers >= 1")
    if model is not None:
        adapter = load_model(model, placement, revision=revision).adapter
    else:
        adapter = forward_cost.random_adapter(config_json, device=placement.device, dtype=placement.dtype)
    if adapter.fast is None:
        raise S2D2Error("bench-forward times the lean forward; this model's architecture has none")
    adapter.fast.enforce_eager = enforce_eager
    with tqdm(total=len(qs) * len(cs) * len(bs), desc="bench-forward", file=sys.stderr) as bar:
        rows = forward_cost.measure(adapter, qs, cs, bs, repeats, progress=lambda: bar.update(1))
    typer.echo("| batch | context | query | ms/forward | us per query token |\n|---|---|---|---|---|")
    for r in rows:
        per_token_us = 1000 * r["ms"] / (r["query"] * r["batch"])
        typer.echo(f"| {r['batch']} | {r['context']} | {r['query']} | {r['ms']:.3f} | {per_token_us:.1f} |")
    # the same format a measured step-cost profile has (cost.step_cost): its cells, key and fit
    name = model if model is not None else str(config_json)
    out = {"device": str(adapter.device), "dtype": str(adapter.dtype), "cells": rows}
    if len(rows) >= 4:
        out.update(FittedCost.fit(rows, profile_key(adapter, name)).to_json())
    if results is not None:
        try:
            bench = json.loads(results.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise S2D2Error(f"cannot read {results}: {exc}") from None
        proj = forward_cost.project(rows, bench, bs[0], cs[0])
        typer.echo(f"\nprojected wall speed-up vs AR at batch {bs[0]}, context {cs[0]}:")
        for p in proj:
            q = p["query_tokens_per_forward"]
            typer.echo(f"  {p['name']}: {p['projected_speedup_vs_ar']}x ({q} query tokens/forward)")
        out["projection"] = proj
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1) + "\n")

"""``s2d2 bench-batch``: output tokens/s of the batched engine by batch limit
(:mod:`~s2d2.bench.throughput`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import S2D2Error
from .options import (
    DeviceFlags,
    EnforceEagerOpt,
    GenerationConfigOpt,
    ModelOpt,
    PageSizeOpt,
    ParallelFlags,
    ProgressOpt,
    RevisionOpt,
    check_at_least,
    check_kv_options,
    int_list,
    load_model,
    option_groups,
)


def _cost(m, cost_profile: str | None, simulate: str | None, shape: Path | None, tp: int = 1):
    """The step-cost profile of the run and, for a simulation, its label (figures are projected);
    ``tp``: with --simulate roofline:NAME, the GPUs the projected forward runs on in tensor parallel."""
    from ..cost.profile import resolve_cost_profile

    if simulate is not None and cost_profile is not None:
        raise S2D2Error("give --cost-profile or --simulate, not both")
    if tp < 1:
        raise S2D2Error(f"--tensor-parallel-size must be >= 1, got {tp}")
    if simulate is None:
        if shape is not None:
            raise S2D2Error("--shape goes with --simulate")
        return resolve_cost_profile(cost_profile, m.adapter, model_path=m.path, model_name=m.name), None
    if not simulate.startswith("roofline:"):
        if tp > 1:
            raise S2D2Error("--tensor-parallel-size with --simulate needs roofline:NAME")
        return _measured_elsewhere(simulate, shape)
    cost = resolve_cost_profile(simulate, m.adapter, model_path=m.path, model_name=m.name, shape=shape)
    if tp > 1:
        cost = dataclasses.replace(cost, tp=tp)  # checks that tp ranks can shard the model
    return cost, f"{simulate} of {shape if shape is not None else m.name} at tensor parallel {tp}"


def _memory_fit(
    m, cost, limits: list[int], n: int, max_new_tokens: int, shared_prefix: int
) -> dict[int, str]:
    """A projection's limits whose rows do not fit one GPU's memory, each with its one-line reason: a
    rank's weights plus the keys and values of ``limit`` rows, each as long as the longest problem's
    prompt (with the shared prefix) and its ``max_new_tokens``; none for a profile without a memory."""
    if not hasattr(cost, "memory_line"):
        return {}
    from ..bench.suites import load_problems

    longest = max(len(m.encode(p["question"])) for p in load_problems("tiny-gsm", "test", n))
    per_row = longest + shared_prefix + max_new_tokens
    lines = {limit: cost.memory_line(limit * per_row) for limit in limits}
    return {limit: line for limit, line in lines.items() if line is not None}


def _mark_unfit(results: dict, unfit: dict[int, str]) -> None:
    """The projected figures of rows that do not fit replaced by "does not fit"."""
    for row in results["rows"]:
        if row["max_num_seqs"] in unfit:
            for key in ("predicted_ms_per_step", "projected_tokens_per_s", "projected_forward_tokens_per_s"):
                row[key] = "does not fit"
            row["memory"] = unfit[row["max_num_seqs"]]


def _measured_elsewhere(path: str, shape: Path | None):
    """A measured profile file of another model or machine (e.g. the SDAR-8B shape on an H200, written by
    ``bench-forward --json`` or a calibration): the run's steps priced with it, labelled projected."""
    from ..cost.step_cost import FittedCost

    if not Path(path).is_file():
        raise S2D2Error(f"--simulate takes roofline:NAME or a measured profile file, got {path!r}")
    if shape is not None:
        raise S2D2Error("--shape goes with --simulate roofline:NAME (a measured profile has its own model)")
    cost = FittedCost.load(Path(path))
    key = cost.key or {}
    what = ", ".join(f"{k} {key[k]}" for k in ("model", "device", "dtype") if key.get(k))
    return cost, f"the measured profile {path}" + (f" ({what})" if what else "")


@option_groups
def bench_batch_command(
    *,
    model: ModelOpt = "tiny-gsm",
    n: Annotated[int, typer.Option("--n", help="Test problems decoded per cell.")] = 128,
    limits: Annotated[str, typer.Option(help="Batch limits (max_num_seqs) to compare.")] = "1,4,16,64",
    configs: Annotated[
        str | None, typer.Option(help="Comma-separated configuration names of the default bench grid.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Most tokens per problem.")] = 64,
    repeats: Annotated[int, typer.Option(help="Repeats per cell (the table shows medians).")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's own).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    progress: ProgressOpt = True,
    placement: DeviceFlags,
    cost_profile: Annotated[
        str | None,
        typer.Option(help="A step-cost profile: a profile file (calibrated when missing) or roofline:NAME."),
    ] = None,
    simulate: Annotated[
        str | None,
        typer.Option(
            help="Project a model (--shape) on a GPU: roofline:h200 | h100 | a100, or price the steps with a "
            "measured profile file of another model or machine (e.g. the SDAR-8B shape on an H200)."
        ),
    ] = None,
    shape: Annotated[
        Path | None, typer.Option(help="With --simulate: the config.json of the model to project.")
    ] = None,
    prefix_cache: Annotated[
        str,
        typer.Option("--prefix-cache", help="Reuse cached prompt prefixes: on | off | both (side by side)."),
    ] = "on",
    kv_page_size: PageSizeOpt = 16,
    kv_budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--kv-budget-tokens",
            help="Most cached positions the rows hold together (rows are preempted past it).",
            show_default=False,
        ),
    ] = None,
    shared_prefix: Annotated[
        int,
        typer.Option(
            "--shared-prefix",
            help="Put the same N-token prefix (worked dev examples) before every problem and measure "
            "time to first token.",
        ),
    ] = 0,
    request_rate: Annotated[
        float | None,
        typer.Option(
            "--request-rate",
            help="Requests arrive as a seeded Poisson process at R requests/s instead of all at the start; "
            "TTFT is measured from arrival, and tokens/s is bound by the arrivals.",
            show_default=False,
        ),
    ] = None,
    revision: RevisionOpt = None,
    generation_config: GenerationConfigOpt = "auto",
    enforce_eager: EnforceEagerOpt = False,
    parallel: ParallelFlags,
) -> None:
    """Decode the same N problems with every configuration at every batch limit (interleaved) and print
    output tokens/s, the speed-up against the first limit, forwards/s, rows per forward and query tokens
    against the model's measured query-token ceiling; with --shared-prefix, also prefill forwards per
    request and time to first token (p50), with the prefix cache on, off or both; with --request-rate,
    open-loop Poisson arrivals (the same in every cell) and time to first token from arrival (p50, p99)."""
    from ..bench import throughput, throughput_table

    lims = int_list(limits, "--limits")
    check_kv_options(kv_page_size, kv_budget_tokens)
    caches = {"on": [True], "off": [False], "both": [False, True]}.get(prefix_cache)
    if caches is None:
        raise S2D2Error(f"--prefix-cache takes on, off or both, got {prefix_cache!r}")
    check_at_least("--shared-prefix", shared_prefix, 0)
    throughput.check_request_rate(request_rate)
    names = [c for c in configs.split(",") if c] if configs else list(throughput.DEFAULT_CONFIGS)
    # with --simulate, -tp prices N GPUs (the model runs here in one process); without, it loads N ranks
    tp = parallel.tensor_parallel_size
    loaded = dataclasses.replace(parallel, tensor_parallel_size=tp if simulate is None else 1)
    m = load_model(
        model, placement, threads=threads, freeze=True, revision=revision, enforce_eager=enforce_eager,
        generation_config=generation_config, **loaded.load_options(),
    )  # fmt: skip
    cost, label = _cost(m, cost_profile, simulate, shape, 1 if simulate is None else tp)
    unfit = _memory_fit(m, cost, lims, n, max_new_tokens, shared_prefix) if label else {}
    if unfit and len(unfit) == len(lims):  # not even the smallest batch: nothing to run
        typer.echo(f"PROJECTED {label}: {unfit[min(lims)]}")
        if json_out is not None:
            verdict = {"projected": label, "fits": False, "memory": unfit}
            json_out.write_text(json.dumps(verdict, indent=1) + "\n")
        return
    results = throughput.run_throughput(
        m,
        n=n,
        limits=lims,
        configs=names,
        max_new_tokens=max_new_tokens,
        repeats=repeats,
        progress=progress,
        cost=cost,
        simulate=label,
        prefix_cache=caches,
        kv_page_size=kv_page_size,
        kv_budget_tokens=kv_budget_tokens,
        shared_prefix=shared_prefix,
        request_rate=request_rate,
    )
    _mark_unfit(results, unfit)
    typer.echo(throughput_table.render(results))
    for limit, line in sorted(unfit.items()):
        typer.echo(f"PROJECTED at {limit} rows: {line}")
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=1) + "\n")

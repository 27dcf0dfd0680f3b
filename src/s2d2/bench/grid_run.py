"""Running a bench: every configuration on every problem, in one process (:func:`run_bench`).

Fairness: configurations are interleaved problem by problem (problem ``i`` runs every configuration,
starting at configuration ``i mod K`` and wrapping round), so machine drift and background load hit
every configuration alike. The model is warmed up before anything is timed. Engine-scoped routing
statistics (``ucb_scope=engine``) are cleared after the warm-up, so a run does not depend on what the
model decoded before it.

Batches: with ``max_num_seqs=N > 1`` the problems run in chunks of N instead (chunk ``c`` runs every
configuration, starting at ``c mod K``, each as ONE ``generate_batch`` call over the chunk). Accuracy,
NFE and the other counters are those of ``N = 1`` (the engine is batch invariant; greedy decoding); a
problem's seconds are then the call's wall time / the chunk's size, so s/problem and tokens/s measure
the throughput of N rows decoding together.

The figures of each run are defined in :mod:`.summary`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ..errors import S2D2Error
from .grids import BenchConfig, get_grid
from .outdir import prepare_out_dir
from .report import require_matplotlib, write_results
from .suites import score_answer
from .summary import Totals, add_speedups, summarize


def machine_info(model: Any = None) -> dict[str, Any]:
    """What the timings depend on: platform, CPU, library versions, threads, device and dtype."""
    import torch

    from ..version import __version__

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "s2d2": __version__,
    }
    adapter = getattr(model, "adapter", None)
    if adapter is not None:
        info["device"] = str(getattr(adapter, "device", ""))
        info["dtype"] = str(getattr(adapter, "dtype", "")).replace("torch.", "")
        if getattr(adapter, "device", None) is not None and adapter.device.type == "cuda":
            info["gpu"] = torch.cuda.get_device_name(adapter.device)
    return info


def run_bench(
    model: Any,
    problems: Sequence[dict],
    configs: str | Sequence[BenchConfig],
    *,
    max_new_tokens: int = 64,
    suite: str = "tiny-gsm",
    split: str = "test",
    model_name: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    warmup: bool = True,
    max_num_seqs: int = 1,
) -> dict[str, Any]:
    """Run every configuration on every problem (interleaved problem by problem) and summarize.

    ``model``: an :class:`~s2d2.model.S2D2Model` with a tokenizer; ``problems``: dicts with ``id``,
    ``question`` and ``final``; ``configs``: a grid name or :class:`BenchConfig` list. Every generation
    is greedy with ``max_new_tokens`` and seed 0. Returns the ``results.json`` dict; with ``out_dir``
    also writes ``problems.jsonl`` (as it goes), ``results.json``, ``table.md`` and the PNG plots there.
    ``max_num_seqs`` > 1: run chunks of that many problems per ``generate_batch`` call (module docstring);
    the model must decode at least that many rows together.
    """
    cfgs, problems = _check_inputs(model, problems, configs)
    batch = _check_batch(model, max_num_seqs)
    configs_out, decode_cfgs = _resolve_configs(model, cfgs, max_new_tokens)  # all, before anything runs

    out = None
    if out_dir is not None:
        require_matplotlib()
        out = prepare_out_dir(out_dir)

    if warmup:
        _warm_up(model, problems, cfgs, decode_cfgs, batch, max_new_tokens)
    routing = getattr(getattr(model, "engine", None), "routing", None)
    if routing is not None:
        routing.clear()  # engine-scoped UCB learns within this run only
    totals = _run_interleaved(model, problems, cfgs, decode_cfgs, batch, suite, out, progress)

    runs = [summarize(c, conf, t) for c, conf, t in zip(cfgs, configs_out, totals, strict=True)]
    add_speedups(runs, totals)
    results = {
        "model": model_name if model_name is not None else str(getattr(model, "name", "")),
        "suite": suite,
        "split": split,
        "n": len(problems),
        "max_num_seqs": batch,
        "machine": machine_info(model),
        "runs": runs,
    }
    if out is not None:
        write_results(results, out)
    return results


def _check_inputs(
    model: Any, problems: Sequence[dict], configs: str | Sequence[BenchConfig]
) -> tuple[list[BenchConfig], list[dict]]:
    """The configurations (a grid name looked up) and the problems as lists, if there is something to run
    with uniquely named configurations and the model has a tokenizer."""
    cfgs = get_grid(configs) if isinstance(configs, str) else list(configs)
    problems = list(problems)
    if not cfgs:
        raise S2D2Error("no configurations to run")
    if not problems:
        raise S2D2Error("no problems to run")
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise S2D2Error("configuration names must be unique")
    if getattr(model, "tokenizer", None) is None:
        raise S2D2Error(f"model {getattr(model, 'name', model)} has no tokenizer; bench needs text prompts")
    return cfgs, problems


def _check_batch(model: Any, max_num_seqs: int) -> int:
    """``max_num_seqs`` if it is an integer >= 1 the model can decode together (its engine's limit)."""
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise S2D2Error(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    if max_num_seqs > 1:
        if not hasattr(model, "generate_batch"):
            raise S2D2Error(f"max_num_seqs={max_num_seqs} needs a model with generate_batch")
        limit = getattr(model, "max_num_seqs", None)
        if isinstance(limit, int) and limit < max_num_seqs:
            raise S2D2Error(
                f"max_num_seqs={max_num_seqs} exceeds the {limit} rows the model decodes together; "
                f"load it with s2d2.load(..., max_num_seqs={max_num_seqs})"
            )
    return max_num_seqs


def _resolve_configs(
    model: Any, cfgs: Sequence[BenchConfig], max_new_tokens: int
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each configuration's settings for the record (block size and steps resolved) and its decode config;
    an invalid configuration fails here."""
    configs_out: list[dict[str, Any]] = []
    decode_cfgs = []
    for c in cfgs:
        config = {**c.expanded(), "max_new_tokens": max_new_tokens, "seed": 0}
        dc = model.make_config(**config)
        config["block_size"], config["steps"] = dc.block_size, dc.num_steps  # resolved, for the record
        configs_out.append(config)
        decode_cfgs.append(dc)
    return configs_out, decode_cfgs


def _warm_up(
    model: Any,
    problems: list[dict],
    cfgs: Sequence[BenchConfig],
    decode_cfgs: Sequence[Any],
    batch: int,
    max_new_tokens: int,
) -> None:
    """One short generation (batch) per decoder family, untimed."""
    seen: set[str] = set()
    for c, dc in zip(cfgs, decode_cfgs, strict=True):
        if c.decoder not in seen:
            seen.add(c.decoder)
            short = dc.replace(max_new_tokens=min(8, max_new_tokens))
            if batch == 1:
                model.generate(problems[0]["question"], short)
            else:
                model.generate_batch([p["question"] for p in problems[:batch]], short)


def _run_interleaved(
    model: Any,
    problems: list[dict],
    cfgs: Sequence[BenchConfig],
    decode_cfgs: Sequence[Any],
    batch: int,
    suite: str,
    out: Path | None,
    progress: bool,
) -> list[Totals]:
    """Every configuration on every chunk of ``batch`` problems, chunk ``c`` starting at configuration
    ``c mod K``; the totals per configuration. With ``out``, each problem's record goes to
    ``problems.jsonl`` there as it finishes."""
    from tqdm.auto import tqdm

    totals = [Totals() for _ in cfgs]
    K = len(cfgs)
    with contextlib.ExitStack() as stack:
        records = None
        if out is not None:
            records = stack.enter_context(open(out / "problems.jsonl", "w", encoding="utf-8"))
        bar = stack.enter_context(
            tqdm(total=len(problems) * K, desc="bench", unit="gen", file=sys.stderr, disable=not progress)
        )
        for c, start in enumerate(range(0, len(problems), batch)):
            chunk = problems[start : start + batch]
            for j in [(c + r) % K for r in range(K)]:
                outs, seconds = _generate_chunk(model, chunk, decode_cfgs[j], batch)
                for k, (prob, res) in enumerate(zip(chunk, outs, strict=True)):
                    _record(totals[j], records, cfgs[j].name, suite, start + k, prob, res, seconds)
                bar.set_postfix_str(cfgs[j].name, refresh=False)
                bar.update(len(chunk))
    return totals


def _generate_chunk(model: Any, chunk: list[dict], dc: Any, batch: int) -> tuple[list[Any], float]:
    """The chunk's generations under ``dc`` and the seconds per problem (the call's wall time / size)."""
    t0 = time.perf_counter()
    if batch == 1:  # one problem at a time: exactly the unbatched path
        outs = [model.generate(chunk[0]["question"], dc)]
    else:
        outs = model.generate_batch([p["question"] for p in chunk], dc)
    return outs, (time.perf_counter() - t0) / len(chunk)


def _record(
    totals: Totals,
    records: IO[str] | None,
    name: str,
    suite: str,
    i: int,
    prob: dict,
    res: Any,
    seconds: float,
) -> None:
    """Score problem ``i``'s generation ``res`` under configuration ``name``, count it in ``totals``
    and, with ``records``, write its line of ``problems.jsonl``."""
    correct, compiles = score_answer(suite, res.text, prob)
    s = res.stats
    totals.add(s, correct, seconds, compiles)
    if records is not None:
        rec = {
            "config": name,
            "problem_id": prob.get("id", i),
            "correct": correct,
            "nfe": s.nfe,
            "tokens": s.generated_tokens,
            "seconds": round(seconds, 6),
            "answer": res.text,
            "gold": prob.get("final", prob.get("answer")),
        }
        records.write(json.dumps(rec) + "\n")

"""Accuracy and speed of many decoding configurations on the same problems (behind ``s2d2 bench``).

Pure-Python API (the ``s2d2 bench`` command of the command-line package is a thin layer over it):

- :data:`GRIDS`: named lists of :class:`BenchConfig` (``default``, ``paper``, ``quick``).
- :func:`run_bench`: run configurations over problems in one process and return the results dict
  (the schema of ``results.json``); with ``out_dir`` it also writes every output file.
- :func:`render_table`, :func:`plot_results`, :func:`write_results`: the table and the plots.
- :func:`wilson_interval`, :func:`pareto_frontier`: the statistics behind them.

Fairness: configurations are interleaved problem by problem (problem ``i`` runs every configuration,
starting at configuration ``i mod K`` and wrapping round), so machine drift and background load hit
every configuration alike. The model is warmed up before anything is timed.

Batches: with ``max_num_seqs=N > 1`` the problems run in chunks of N instead (chunk ``c`` runs every
configuration, starting at ``c mod K``, each as ONE ``generate_batch`` call over the chunk). Accuracy,
NFE and the other counters are those of ``N = 1`` (the engine is batch invariant; greedy decoding); a
problem's seconds are then the call's wall time / the chunk's size, so s/problem and tokens/s measure
the throughput of N rows decoding together.

Definitions (totals over all problems, prefill included): NFE/token = forwards / generated tokens;
tokens/forward = its inverse; verification rate = verification forwards / generated tokens; acceptance
rate = accepted / drafted tokens over verified spans (``None`` where nothing was verified); speed-ups
vs AR are per generated token: AR's NFE/token over the configuration's, and the configuration's
tokens/s over AR's. Wall time is measured around ``model.generate`` (tokenization included).

Diagnostics per run (where the cost goes): ``mean_accepted_per_verification`` (accepted draft tokens
per verification forward, the correction token not counted), ``full_accept_fraction`` (verifications
whose whole span was accepted), ``fallback_commits_per_token`` (tokens S2D2 committed by its baseline
rule, unverified) and ``nfe_per_token_by_kind`` (prefill / draft / verify / commit forwards per token).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import S2D2Error
from .metrics import wilson_interval

# --------------------------------------------------------------------------------------------- configurations

#: The decoder families (the ``decoder`` field of each run).
FAMILIES = ("ar", "static", "dynamic", "eb", "s2d2")
#: Files of ours in an output directory; nothing else there is ever written.
OUTPUT_FILES = ("results.json", "problems.jsonl", "table.md", "accuracy_vs_nfe.png", "accuracy_vs_wall.png")


@dataclass(frozen=True)
class BenchConfig:
    """One named configuration: decoding settings under the CLI's names (a ``preset`` is allowed)."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def decoder(self) -> str:
        """The decoder family (``ar``, ``static``, ``dynamic``, ``eb`` or ``s2d2``)."""
        return str(self.expanded().get("decoder", "s2d2"))

    def expanded(self) -> dict[str, Any]:
        """The settings with the preset's values written out (explicit settings win); the preset is a name
        in :data:`s2d2.config.PRESETS` or a preset file."""
        from .config import preset_settings
        from .errors import ConfigError

        out: dict[str, Any] = {}
        if "preset" in self.settings:
            try:
                values = preset_settings(self.settings["preset"])
            except ConfigError as exc:
                raise S2D2Error(f"configuration {self.name}: {exc}") from None
            out["preset"] = self.settings["preset"]
            out.update(values)
        out.update({k: v for k, v in self.settings.items() if k != "preset"})
        return out


def _num(x: float) -> str:
    return f"{x:g}"


def _ar() -> BenchConfig:
    return BenchConfig("ar", {"decoder": "ar"})


def _static(b: int, s: int) -> BenchConfig:
    return BenchConfig(f"static-b{b}-s{s}", {"decoder": "static", "block_size": b, "steps": s})


def _dynamic(b: int, tau: float) -> BenchConfig:
    return BenchConfig(
        f"dynamic-b{b}-t{_num(tau)}", {"decoder": "dynamic", "block_size": b, "threshold": tau}
    )


def _eb(b: int, gamma: float) -> BenchConfig:
    return BenchConfig(f"eb-b{b}-g{_num(gamma)}", {"decoder": "eb", "block_size": b, "gamma": gamma})


#: S2D2 routings: short name -> policy settings (docs/METHOD.md section 4 and the paper's settings).
S2D2_ROUTINGS: dict[str, Callable[[int], dict[str, Any]]] = {
    "always": lambda b: {"policy": "always"},
    "score-static": lambda b: {"policy": "score", "score": "static", "penalty": 1.0, "score_threshold": 0.0},
    "score-dynamic": lambda b: {
        "policy": "score",
        "score": "dynamic",
        "penalty": 1.0,
        "score_threshold": 0.0,
    },
    "hysteresis": lambda b: {
        "policy": "hysteresis",
        "score": "dynamic",
        "penalty": 1.0,
        "hysteresis_on": 1.0,
        "hysteresis_off": -5.0,
    },
    "min-span": lambda b: {"policy": "min-span", "min_span": max(2, b // 4)},
    "ucb": lambda b: {"policy": "ucb", "ucb_beta": 1.0, "ucb_bins": 2},
}


def _s2d2(
    b: int, routing: str, acceptance: str, *, fallback_tau: float = 0.9, causal_cache: bool = False
) -> BenchConfig:
    acc = "strict" if acceptance == "strict" else "prob"
    name = f"s2d2-b{b}-{routing}-{acc}"
    settings: dict[str, Any] = {
        "decoder": "s2d2",
        "block_size": b,
        **S2D2_ROUTINGS[routing](b),
        "acceptance": acceptance,
        "fallback": "dynamic",
        "threshold": fallback_tau,
    }
    if fallback_tau != 0.9:
        name += f"-fb{_num(fallback_tau)}"
    if causal_cache:
        settings["causal_cache"] = True
        name += "-cc"
    return BenchConfig(name, settings)


def _lossless(b: int) -> BenchConfig:
    return BenchConfig(f"lossless-b{b}", {"preset": "lossless", "block_size": b})


def _lossless_fused(b: int) -> BenchConfig:
    return BenchConfig(f"lossless-fused-b{b}", {"preset": "lossless-fused", "block_size": b})


def _default_grid() -> list[BenchConfig]:
    blocks = (4, 8, 16)
    grid = [_ar()]
    grid += [_static(b, s) for b in blocks for s in sorted({b, b // 2, b // 4}, reverse=True)]
    grid += [_dynamic(b, tau) for b in blocks for tau in (0.5, 0.7, 0.9, 0.95, 0.99)]
    grid += [_eb(b, g) for b in (8, 16) for g in (0.01, 0.1, 0.5)]
    for b in blocks:
        for routing in S2D2_ROUTINGS:
            grid += [_s2d2(b, routing, acc) for acc in ("strict", "probabilistic")]
        grid += [_lossless(b), _lossless_fused(b)]
    # cheap S2D2 points: dynamic-score routing with a low fallback threshold (to face dynamic tau .5/.7)
    grid += [_s2d2(b, "score-dynamic", "strict", fallback_tau=tau) for b in blocks for tau in (0.5, 0.7)]
    # routing that skips verification falls back to the threshold rule: a stricter fallback + causal cache
    grid += [
        _s2d2(b, "score-static", "strict", fallback_tau=tau, causal_cache=True)
        for b in (8, 16)
        for tau in (0.95, 0.99)
    ]
    return grid


def _paper_grid() -> list[BenchConfig]:
    return [
        _ar(),
        _dynamic(4, 0.85),
        _dynamic(16, 0.85),
        BenchConfig("paper-sdar-a", {"preset": "paper-sdar-a"}),
        BenchConfig("paper-sdar-b", {"preset": "paper-sdar-b"}),
    ]


def _quick_grid() -> list[BenchConfig]:
    return [
        _ar(),
        _dynamic(8, 0.9),
        _s2d2(8, "always", "strict"),
        _s2d2(8, "score-static", "strict"),
        _lossless(8),
    ]


def _headline_grid() -> list[BenchConfig]:
    """The rows of BENCHMARKS.md's headline table (all in the default grid)."""
    return [
        _ar(),
        _dynamic(8, 0.9),
        _s2d2(8, "always", "strict"),
        _s2d2(8, "score-dynamic", "strict"),
        _s2d2(16, "score-static", "strict", fallback_tau=0.95, causal_cache=True),
        _lossless(8),
        _lossless_fused(8),
        _lossless(16),
        _lossless_fused(16),
    ]


def _ucb_grid() -> list[BenchConfig]:
    """UCB routing by scope and reward at B8 and B16, beside always-verify (BENCHMARKS.md, METHOD 9)."""
    grid = [_ar()]
    for b in (8, 16):
        always, ucb = _s2d2(b, "always", "strict"), _s2d2(b, "ucb", "strict")
        engine = {**ucb.settings, "ucb_scope": "engine"}
        grid += [
            always,
            ucb,
            BenchConfig(f"s2d2-b{b}-ucb-engine-strict", engine),
            BenchConfig(f"s2d2-b{b}-ucb-engine-committed-strict", {**engine, "ucb_reward": "committed"}),
        ]
    return grid


#: Named grids of configurations.
GRIDS: dict[str, list[BenchConfig]] = {
    "default": _default_grid(),
    "headline": _headline_grid(),
    "paper": _paper_grid(),
    "quick": _quick_grid(),
    "ucb": _ucb_grid(),
}


def get_grid(name: str) -> list[BenchConfig]:
    if name not in GRIDS:
        raise S2D2Error(f"unknown grid {name!r}; choose one of: {', '.join(GRIDS)}")
    return list(GRIDS[name])


# ---------------------------------------------------------------------------------------------- suites

#: Benchmark suites: splits and the generation length their answers need.
SUITES: dict[str, dict[str, Any]] = {
    "tiny-gsm": {"splits": ("test", "dev"), "max_new_tokens": 64},
}


def load_problems(suite: str, split: str, n: int | None = None) -> list[dict]:
    """The first ``n`` problems of ``suite``/``split`` (all of them when ``n`` is None); each has ``id``,
    ``question`` and ``final``."""
    if suite not in SUITES:
        raise S2D2Error(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    splits = SUITES[suite]["splits"]
    if split not in splits:
        raise S2D2Error(f"unknown split {split!r} of suite {suite}; choose one of: {', '.join(splits)}")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise S2D2Error(f"n must be an integer >= 1, got {n!r}")
    from .tasks import tiny_gsm

    try:
        problems = tiny_gsm.load_split(split, n)
    except (FileNotFoundError, ValueError) as exc:
        raise S2D2Error(f"cannot load {suite} {split}: {exc}") from None
    if n is not None and len(problems) < n:
        raise S2D2Error(f"n={n} exceeds the {len(problems)} problems of {suite} {split}")
    return problems


def score_answer(suite: str, text: str, problem: dict) -> bool:
    from .tasks import tiny_gsm

    return tiny_gsm.is_correct(text, problem["final"])


# ---------------------------------------------------------------------------------------------- statistics


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the ``(cost, accuracy)`` points no other point beats (cost no higher and accuracy no
    lower, one of them strictly), sorted by cost. Of identical points the first is kept; points with a
    missing or NaN coordinate are ignored."""
    valid = [
        i
        for i, (c, a) in enumerate(points)
        if c is not None and a is not None and not (math.isnan(c) or math.isnan(a))
    ]
    order = sorted(valid, key=lambda i: (points[i][0], -points[i][1], i))
    out: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            out.append(i)
            best = points[i][1]
    return out


# ---------------------------------------------------------------------------------------------- running


@dataclass
class _Totals:
    problems: int = 0
    correct: int = 0
    nfe: int = 0
    nfe_prefill: int = 0
    nfe_draft: int = 0
    nfe_verify: int = 0
    nfe_commit: int = 0
    tokens: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    full_accepts: int = 0
    fallback_commits: int = 0
    query_tokens: int = 0
    predraft_hits: int = 0
    predraft_misses: int = 0
    seconds: float = 0.0


#: Counters summed from each generation's statistics into :class:`_Totals` (same names).
_COUNTERS = (
    "nfe",
    "nfe_prefill",
    "nfe_draft",
    "nfe_verify",
    "nfe_commit",
    "verify_steps",
    "drafted",
    "accepted",
    "fallback_commits",
    "full_accepts",
    "query_tokens",
    "predraft_hits",
    "predraft_misses",
)


def machine_info(model: Any = None) -> dict[str, Any]:
    """What the timings depend on: platform, CPU, library versions, threads, device and dtype."""
    import torch

    from . import __version__

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


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _round(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def _summarize(cfg: BenchConfig, config: dict[str, Any], t: _Totals) -> dict[str, Any]:
    tokens = max(t.tokens, 1)
    lo, hi = wilson_interval(t.correct, t.problems)
    return {
        "name": cfg.name,
        "decoder": cfg.decoder,
        "config": config,
        "accuracy": _round(t.correct / t.problems if t.problems else 0.0),
        "accuracy_ci95": [_round(lo), _round(hi)],
        "nfe_per_token": _round(t.nfe / tokens),
        "tokens_per_forward": _round(_ratio(t.tokens, t.nfe)),
        "verify_rate": _round(t.nfe_verify / tokens),
        "acceptance_rate": _round(_ratio(t.accepted, t.drafted)),
        "seconds_per_problem": _round(t.seconds / t.problems if t.problems else 0.0),
        "tokens_per_second": _round(_ratio(t.tokens, t.seconds), 3),
        "speedup_nfe_vs_ar": None,
        "speedup_wall_vs_ar": None,
        # diagnostics: where the cost goes
        "mean_accepted_per_verification": _round(_ratio(t.accepted, t.verify_steps)),
        "full_accept_fraction": _round(_ratio(t.full_accepts, t.verify_steps)),
        "fallback_commits_per_token": _round(t.fallback_commits / tokens),
        "query_tokens_per_forward": _round(_ratio(t.query_tokens, t.nfe)),
        "query_tokens_per_token": _round(t.query_tokens / tokens),
        "predraft_hit_rate": _round(_ratio(t.predraft_hits, t.predraft_hits + t.predraft_misses)),
        "nfe_per_token_by_kind": {
            "prefill": _round(t.nfe_prefill / tokens),
            "draft": _round(t.nfe_draft / tokens),
            "verify": _round(t.nfe_verify / tokens),
            "commit": _round(t.nfe_commit / tokens),
        },
    }


def _add_speedups(runs: list[dict[str, Any]], totals: list[_Totals]) -> None:
    ar = next((i for i, r in enumerate(runs) if r["decoder"] == "ar"), None)
    if ar is None:
        return
    a = totals[ar]
    ar_nfe_tok = a.nfe / max(a.tokens, 1)
    ar_sec_tok = a.seconds / max(a.tokens, 1)
    for i, (run, t) in enumerate(zip(runs, totals, strict=True)):
        if i == ar:
            run["speedup_nfe_vs_ar"] = run["speedup_wall_vs_ar"] = 1.0
            continue
        nfe_tok = t.nfe / max(t.tokens, 1)
        sec_tok = t.seconds / max(t.tokens, 1)
        run["speedup_nfe_vs_ar"] = _round(_ratio(ar_nfe_tok, nfe_tok), 4)
        run["speedup_wall_vs_ar"] = _round(_ratio(ar_sec_tok, sec_tok), 4)


def check_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a path, if we may write our files there (it need not exist yet); creates nothing."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise S2D2Error(f"output path {out} exists and is not a directory")
    for name in OUTPUT_FILES:
        if (out / name).exists() and not (out / name).is_file():
            raise S2D2Error(f"{out / name} exists and is not a file; choose another output directory")
    return out


def _prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    out = check_out_dir(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise S2D2Error(f"cannot create output directory {out}: {exc.strerror or exc}") from None
    return out


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise S2D2Error("plots need matplotlib: pip install matplotlib") from None


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
    batch = _check_batch(model, max_num_seqs)

    # every configuration is validated before anything runs
    configs_out: list[dict[str, Any]] = []
    decode_cfgs = []
    for c in cfgs:
        config = {**c.expanded(), "max_new_tokens": max_new_tokens, "seed": 0}
        dc = model.make_config(**config)
        config["block_size"], config["steps"] = dc.block_size, dc.num_steps  # resolved, for the record
        configs_out.append(config)
        decode_cfgs.append(dc)

    out = None
    if out_dir is not None:
        require_matplotlib()
        out = _prepare_out_dir(out_dir)

    if warmup:  # one short generation (batch) per decoder family, untimed
        seen: set[str] = set()
        for c, dc in zip(cfgs, decode_cfgs, strict=True):
            if c.decoder not in seen:
                seen.add(c.decoder)
                short = dc.replace(max_new_tokens=min(8, max_new_tokens))
                if batch == 1:
                    model.generate(problems[0]["question"], short)
                else:
                    model.generate_batch([p["question"] for p in problems[:batch]], short)

    from tqdm.auto import tqdm

    totals = [_Totals() for _ in cfgs]
    K = len(cfgs)
    with contextlib.ExitStack() as stack:
        records = None
        if out is not None:
            records = stack.enter_context(open(out / "problems.jsonl", "w", encoding="utf-8"))
        bar = stack.enter_context(
            tqdm(total=len(problems) * K, desc="bench", unit="gen", file=sys.stderr, disable=not progress)
        )

        def record(i: int, prob: dict, j: int, res: Any, seconds: float) -> None:
            correct = bool(score_answer(suite, res.text, prob))
            s = res.stats
            t = totals[j]
            t.problems += 1
            t.correct += int(correct)
            for k in _COUNTERS:
                setattr(t, k, getattr(t, k) + getattr(s, k))
            t.tokens += s.generated_tokens
            t.seconds += seconds
            if records is not None:
                rec = {
                    "config": cfgs[j].name,
                    "problem_id": prob.get("id", i),
                    "correct": correct,
                    "nfe": s.nfe,
                    "tokens": s.generated_tokens,
                    "seconds": round(seconds, 6),
                    "answer": res.text,
                    "gold": prob["final"],
                }
                records.write(json.dumps(rec) + "\n")

        for c, start in enumerate(range(0, len(problems), batch)):
            chunk = problems[start : start + batch]
            for j in [(c + r) % K for r in range(K)]:
                dc = decode_cfgs[j]
                t0 = time.perf_counter()
                if batch == 1:  # one problem at a time: exactly the unbatched path
                    outs = [model.generate(chunk[0]["question"], dc)]
                else:
                    outs = model.generate_batch([p["question"] for p in chunk], dc)
                seconds = (time.perf_counter() - t0) / len(chunk)
                for k, (prob, res) in enumerate(zip(chunk, outs, strict=True)):
                    record(start + k, prob, j, res, seconds)
                bar.set_postfix_str(cfgs[j].name, refresh=False)
                bar.update(len(chunk))

    runs = [_summarize(c, conf, t) for c, conf, t in zip(cfgs, configs_out, totals, strict=True)]
    _add_speedups(runs, totals)
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


# ---------------------------------------------------------------------------------------------- output

TABLE_COLUMNS = (
    "configuration",
    "accuracy (95% CI)",
    "NFE/token",
    "tokens/forward",
    "verification rate",
    "acceptance rate",
    "query tokens/forward",
    "pre-draft hit rate",
    "s/problem",
    "tokens/s",
    "speed-up vs AR (NFE)",
    "speed-up vs AR (wall)",
)


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in results["runs"]:
        lo, hi = r["accuracy_ci95"]
        rows.append(
            [
                r["name"],
                f"{r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]",
                _fmt(r["nfe_per_token"], ".3f"),
                _fmt(r["tokens_per_forward"], ".2f"),
                _fmt(r["verify_rate"], ".3f"),
                _fmt(r["acceptance_rate"], ".3f"),
                _fmt(r.get("query_tokens_per_forward"), ".1f"),
                _fmt(r.get("predraft_hit_rate"), ".3f"),
                _fmt(r["seconds_per_problem"], ".4f"),
                _fmt(r["tokens_per_second"], ".1f"),
                _fmt(r["speedup_nfe_vs_ar"], ".2f", "x"),
                _fmt(r["speedup_wall_vs_ar"], ".2f", "x"),
            ]
        )
    return rows


def render_table(results: dict[str, Any]) -> str:
    """A Markdown table with one row per configuration and every column of :data:`TABLE_COLUMNS`."""
    rows = table_rows(results)
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(TABLE_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    sep = "|" + "|".join("-" * (w + 1) + (":" if k else "-") for k, w in enumerate(widths)) + "|"
    title = (
        f"{results.get('model', '')} on {results.get('suite', '')} {results.get('split', '')}, "
        f"n={results.get('n', '')} (speed-ups per generated token)"
    )
    batch = results.get("max_num_seqs", 1)
    if isinstance(batch, int) and batch > 1:
        title += f"; batches of {batch}: s/problem and tokens/s are the throughput of {batch} rows"
    return "\n".join([title, "", line(TABLE_COLUMNS), sep, *(line(r) for r in rows)]) + "\n"


_STYLE = {
    "ar": ("black", "*"),
    "static": ("tab:gray", "s"),
    "dynamic": ("tab:blue", "o"),
    "eb": ("tab:green", "^"),
    "s2d2": ("tab:red", "D"),
}


def plot_results(results: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Accuracy vs NFE/token and accuracy vs s/problem, one colour per decoder family with its Pareto
    frontier drawn; returns the two PNG paths."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    runs = results["runs"]
    paths = []
    for key, xlabel, fname in (
        ("nfe_per_token", "NFE per generated token (lower is faster)", "accuracy_vs_nfe.png"),
        ("seconds_per_problem", "wall time per problem, s (lower is faster)", "accuracy_vs_wall.png"),
    ):
        fig = Figure(figsize=(9, 6), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        ar = [r for r in runs if r["decoder"] == "ar"]
        if ar:
            ax.axhline(float(ar[0]["accuracy"]), color="black", ls=":", lw=0.8, alpha=0.6)
        for fam in FAMILIES:
            rs = [r for r in runs if r["decoder"] == fam and r[key] is not None]
            if not rs:
                continue
            color, marker = _STYLE[fam]
            xs = [float(r[key]) for r in rs]
            ys = [float(r["accuracy"]) for r in rs]
            err = [
                [y - r["accuracy_ci95"][0] for y, r in zip(ys, rs, strict=True)],
                [r["accuracy_ci95"][1] - y for y, r in zip(ys, rs, strict=True)],
            ]
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=color, alpha=0.25, lw=0.8)
            big = fam == "ar"
            ax.scatter(
                xs,
                ys,
                c=color,
                marker=marker,
                s=120 if big else 40,
                label=fam,
                alpha=0.85,
                zorder=4 if big else 3,
            )
            front = pareto_frontier(list(zip(xs, ys, strict=True)))
            if len(front) > 1:
                ax.plot([xs[i] for i in front], [ys[i] for i in front], color=color, lw=1.5, alpha=0.8)
            for i in front:
                ax.annotate(
                    rs[i]["name"], (xs[i], ys[i]), fontsize=6, xytext=(3, 3), textcoords="offset points"
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (95% Wilson CI)")
        ax.set_title(
            f"{results.get('model', '')}: {results.get('suite', '')} {results.get('split', '')}, "
            f"n={results.get('n', '')} (lines: Pareto frontier per decoder)",
            fontsize=9,
        )
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, format="png")
        paths.append(path)
    return paths


def write_results(results: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``results.json``, ``table.md`` and the plots into ``out_dir`` (only those files)."""
    out = _prepare_out_dir(out_dir)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "table.md").write_text(render_table(results), encoding="utf-8")
    return [out / "results.json", out / "table.md", *plot_results(results, out)]

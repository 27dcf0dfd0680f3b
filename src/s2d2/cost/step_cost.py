"""What one engine step costs: predicted milliseconds from the step's shape.

A step's shape (:class:`StepShape`) is, per row, the query tokens it feeds and the cached positions
it attends to. Two profiles predict its time:

* :class:`FittedCost`: measured on this machine by a short calibration of dummy forwards over a grid
  (rows x query tokens x context) and of steps shaped like the engine's (rows of every kind at spread
  cached lengths, through the engine's forward path: :mod:`.mixed_steps`), fitted by least squares to
  ``ms = a + b * rows + c * tokens + d * attention / 1000`` where ``attention`` counts the query-key
  pairs the padded attention computes (per attention group: rows x longest query x longest keys).
  It is written to a JSON file keyed by model, device, dtype and threads, in the format
  ``s2d2 bench-forward --json`` writes (its cells plus the fit), and read back when the key matches.
* :class:`RooflineCost`: computed from a model's config and a hardware description (:data:`HARDWARE`,
  from the vendors' data sheets): the larger of compute time (2 x parameters x tokens plus attention
  FLOPs, at an efficiency) and memory time (weights read once per forward plus every row's keys and
  values, at an efficiency), plus a fixed overhead per forward. Figures from it are projections. On
  N GPUs in tensor parallel it prices one rank's share (:mod:`.model_shape`: weights and KV split N
  ways, replicated parts whole) plus the forward's all-reduces over NVLink (:mod:`.hardware`), and
  says when a rank's weights and KV do not fit its GPU's memory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import S2D2Error
from ..files import write_text_atomically
from ..forward.vocab_summary import LOCAL_WIDTH
from .hardware import HARDWARE, Hardware
from .model_shape import ModelShape


@dataclass(frozen=True)
class StepShape:
    """One forward: ``queries[i]`` tokens fed by row i after ``contexts[i]`` cached positions;
    ``groups`` the attention groups the forward pads rows into, as ``(rows, queries, keys)`` each
    (default: one group of them all)."""

    queries: tuple[int, ...]
    contexts: tuple[int, ...]
    groups: tuple[tuple[int, int, int], ...] | None = None

    @classmethod
    def of(
        cls, queries: Sequence[int], contexts: Sequence[int], groups: Sequence[Sequence[int]]
    ) -> StepShape:
        """``groups``: each attention group's row indices."""
        padded = tuple(
            (len(g), max(queries[i] for i in g), max(queries[i] + contexts[i] for i in g)) for g in groups
        )
        return cls(tuple(queries), tuple(contexts), padded)

    @property
    def padded_attention(self) -> int:
        """Query-key pairs the padded attention computes: sum over groups of rows x queries x keys."""
        if self.groups is None:
            return len(self.queries) * max(self.queries, default=0) * max(
                (q + c for q, c in zip(self.queries, self.contexts, strict=True)), default=0
            )
        return sum(r * q * k for r, q, k in self.groups)

    @property
    def rows(self) -> int:
        return len(self.queries)

    @property
    def tokens(self) -> int:
        return sum(self.queries)

    @property
    def attention(self) -> int:
        """Query-key pairs scored: sum of q x (context + q) over rows."""
        return sum(q * (c + q) for q, c in zip(self.queries, self.contexts, strict=True))


class StepCost(Protocol):
    def predict_ms(self, shape: StepShape) -> float: ...

    def predict_totals(self, rows: int, tokens: int, attention: float, kv: int, padded: float) -> float:
        """The same prediction from a shape's totals: rows, query tokens, query-key pairs scored
        (:attr:`StepShape.attention`), keys held (context + queries, summed over rows) and the padded
        attention's pairs (:attr:`StepShape.padded_attention`); the step planner's cheap form."""
        ...


def _features(rows: int, tokens: int, attention: int) -> list[float]:
    return [1.0, float(rows), float(tokens), attention / 1000.0]


@dataclass
class FittedCost:
    """A least-squares fit of measured forwards (see the module docstring)."""

    coef: tuple[float, float, float, float]
    key: dict[str, Any] = field(default_factory=dict)
    cells: list[dict[str, Any]] = field(default_factory=list)

    def predict_ms(self, shape: StepShape) -> float:
        return self.predict_totals(shape.rows, shape.tokens, 0, 0, shape.padded_attention)

    def predict_totals(self, rows: int, tokens: int, attention: float, kv: int, padded: float) -> float:
        a, b, c, d = self.coef
        return max(0.0, a + b * rows + c * tokens + d * padded / 1000.0)

    @classmethod
    def fit(cls, cells: Sequence[dict[str, Any]], key: dict[str, Any] | None = None) -> FittedCost:
        """Fit ``cells``: uniform ones (``batch``, ``context``, ``query``, ``ms``, as bench-forward
        measures) and mixed steps (``queries``, ``contexts``, ``groups``, ``ms``:
        :func:`~s2d2.cost.mixed_steps.measure_mixed`)."""
        if len(cells) < 4:
            raise S2D2Error(f"a cost fit needs at least 4 measured forwards, got {len(cells)}")
        shapes = [_cell_shape(c) for c in cells]
        feats = [_features(s.rows, s.tokens, s.padded_attention) for s in shapes]
        xs = torch.tensor(feats, dtype=torch.float64)
        ys = torch.tensor([[float(c["ms"])] for c in cells], dtype=torch.float64)
        # relative error matters (a 1 ms step and a 50 ms step alike): weight each cell by 1 / ms
        w = 1.0 / ys.clamp_min(1e-3)
        sol = torch.linalg.lstsq(xs * w, ys * w).solution.view(-1).tolist()
        return cls(tuple(sol), dict(key or {}), list(cells))

    # ------------------------------------------------------------------ the file
    def to_json(self) -> dict[str, Any]:
        fit = {"terms": ["1", "rows", "tokens", "attention/1000"], "coef": list(self.coef)}
        extra = {k: self.key.get(k) for k in ("device", "dtype")}
        return {"key": self.key, "fit": fit, "cells": self.cells, **extra}

    def save(self, path: Path) -> None:
        write_text_atomically(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> FittedCost:
        """Read a profile (or any ``bench-forward --json`` file: its cells are fitted)."""
        try:
            data = json.loads(Path(path).read_text())
            cells = data["cells"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise S2D2Error(f"cannot read the cost profile {path}: {exc}") from None
        key = data.get("key") or {k: data.get(k) for k in ("device", "dtype")}
        fit = data.get("fit")
        if isinstance(fit, dict) and len(fit.get("coef", ())) == 4:
            return cls(tuple(float(c) for c in fit["coef"]), key, cells)
        return cls.fit(cells, key)


def _cell_shape(cell: dict[str, Any]) -> StepShape:
    """The step a measured cell timed: a mixed step as recorded, or ``batch`` rows alike."""
    if "queries" in cell:
        groups = cell.get("groups")
        return StepShape(tuple(cell["queries"]), tuple(cell["contexts"]),
                         None if groups is None else tuple(tuple(g) for g in groups))  # fmt: skip
    return StepShape((cell["query"],) * cell["batch"], (cell["context"],) * cell["batch"])


def profile_key(adapter: Any, model_name: str) -> dict[str, Any]:
    """What a measured profile depends on."""
    return {
        "model": model_name,
        "device": str(adapter.device),
        "dtype": str(adapter.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        #: how it was calibrated (a profile cached by an earlier calibration is measured again)
        "calibration": CALIBRATION_KIND,
    }


#: The calibration grid: small enough for a few seconds on a CPU with a tiny model.
CALIBRATION = {"batch": (1, 4, 16, 64), "query": (1, 4, 16, 48), "context": (32, 192)}
#: What a calibration times: the uniform grid, and steps shaped like the engine's through its runner path
CALIBRATION_KIND = "uniform+steps"


def calibrate(
    adapter: Any,
    key: dict[str, Any],
    measure: Callable[..., list[dict[str, Any]]],
    repeats: int = 3,
    mixed: Callable[..., list[dict[str, Any]]] | None = None,
) -> FittedCost:
    """Time dummy forwards over :data:`CALIBRATION` (``measure`` is :func:`s2d2.cost.measure.measure`)
    and, with ``mixed`` (:func:`s2d2.cost.mixed_steps.measure_mixed`), steps that mix rows of every kind
    at spread cached lengths through the engine's forward path; fit them together."""
    g = CALIBRATION
    cells = measure(adapter, g["query"], g["context"], g["batch"], repeats)
    if mixed is not None:
        cells += mixed(adapter, g["context"], repeats)
    return FittedCost.fit(cells, key)


def measured_profile(
    adapter: Any,
    path: Path,
    key: dict[str, Any],
    measure: Callable[..., list[dict[str, Any]]],
    mixed: Callable[..., list[dict[str, Any]]] | None = None,
) -> FittedCost:
    """The profile in ``path`` when its key matches, else a fresh calibration written there."""
    if path.is_file():
        prof = FittedCost.load(path)
        if prof.key == key:
            return prof
    prof = calibrate(adapter, key, measure, mixed=mixed)
    prof.save(path)
    return prof


# ---------------------------------------------------------------------------------------------- roofline
@dataclass(frozen=True)
class RooflineCost:
    """Projected step time of ``model`` on ``hw`` (see the module docstring), on ``tp`` GPUs of one node
    in tensor parallel: each rank computes and reads its share (:meth:`ModelShape.read_params`, its
    key/value heads' cache), and the ranks add their partial sums by all-reduces over NVLink
    (:meth:`comm_s`). ``tp`` 1 is the one-GPU price, with no communication."""

    model: ModelShape
    hw: Hardware
    tp: int = 1

    def __post_init__(self) -> None:
        self.model.check_tensor_parallel(self.tp)

    def predict_ms(self, shape: StepShape) -> float:
        kv = sum(c + q for q, c in zip(shape.queries, shape.contexts, strict=True))
        return self.predict_totals(shape.rows, shape.tokens, shape.attention, kv, 0)

    def predict_totals(self, rows: int, tokens: int, attention: float, kv: int, padded: float) -> float:
        m, hw = self.model, self.hw
        flops = m.flops(tokens, attention, self.tp)
        nbytes = m.bytes_per_value * m.read_params(tokens, self.tp) + m.kv_bytes_per_position(self.tp) * kv
        compute = flops / (hw.peak_flops * hw.compute_efficiency)
        memory = nbytes / (hw.bandwidth * hw.memory_efficiency)
        return 1e3 * (max(compute, memory) + hw.overhead_s + self.comm_s(tokens))

    def comm_s(self, tokens: int) -> float:
        """The all-reduces of one forward of ``tokens`` tokens, seconds (0 on one GPU): the vocab-parallel
        embedding's, and per layer two of the hidden states (tokens x hidden): after attention and after
        the MLP or MoE block (routed and shared experts reduced together, one reduction per MoE layer);
        then the vocab-parallel LM head's, a small one per token (each rank's reduction of its slice,
        ``LOCAL_WIDTH`` float32, gathered: the rows' summaries, :mod:`~s2d2.forward.vocab_summary`; a
        greedy step needs no full-vocabulary gather)."""
        if self.tp == 1:
            return 0.0
        m, hw = self.model, self.hw
        hidden_bytes = tokens * m.hidden * m.bytes_per_value
        hidden_states = (1 + 2 * m.layers) * hw.all_reduce_s(hidden_bytes, self.tp)
        return hidden_states + hw.all_reduce_s(4 * LOCAL_WIDTH * tokens, self.tp)

    def weight_bytes(self) -> float:
        """Bytes of weights one rank holds."""
        return self.model.bytes_per_value * self.model.held_params(self.tp)

    def memory_line(self, kv_positions: int) -> str | None:
        """``None`` when one rank holds its weights and the keys and values of ``kv_positions`` cached
        positions within the GPU's usable memory; else the one-line reason it does not fit."""
        weights = self.weight_bytes()
        kv = self.model.kv_bytes_per_position(self.tp) * kv_positions
        usable = self.hw.memory_bytes * self.hw.memory_usable
        if weights + kv <= usable:
            return None
        return (
            f"does not fit: per GPU {weights / 1e9:.1f} GB of weights + {kv / 1e9:.1f} GB of KV "
            f"({kv_positions} positions) > {usable / 1e9:.1f} GB usable of {self.hw.name}'s "
            f"{self.hw.memory_bytes / 1e9:.0f} GB at tensor parallel {self.tp}"
        )


def roofline(
    spec: str, shape_config: str | os.PathLike[str] | dict[str, Any], tensor_parallel_size: int = 1
) -> RooflineCost:
    """``roofline:NAME`` for the model of ``shape_config`` (a config.json path or its dict), on
    ``tensor_parallel_size`` GPUs in tensor parallel (a one-line error when they cannot shard it)."""
    name = spec.split(":", 1)[1] if ":" in spec else spec
    if name not in HARDWARE:
        raise S2D2Error(f"unknown hardware {name!r}; choose one of: {', '.join(HARDWARE)}")
    if not isinstance(shape_config, dict):
        try:
            shape_config = json.loads(Path(shape_config).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise S2D2Error(f"cannot read the shape config {shape_config}: {exc}") from None
    return RooflineCost(ModelShape.from_config(shape_config), HARDWARE[name], tensor_parallel_size)


def median_abs_error(pairs: Sequence[tuple[float, float]]) -> float:
    """Median of |predicted - measured| / measured over ``(predicted, measured)`` pairs."""
    errs = sorted(abs(p - m) / m for p, m in pairs if m > 0)
    if not errs:
        return math.nan
    mid = len(errs) // 2
    return errs[mid] if len(errs) % 2 else 0.5 * (errs[mid - 1] + errs[mid])


__all__ = [
    "HARDWARE",
    "FittedCost",
    "Hardware",
    "ModelShape",
    "RooflineCost",
    "StepCost",
    "StepShape",
    "calibrate",
    "measured_profile",
    "median_abs_error",
    "profile_key",
    "roofline",
]

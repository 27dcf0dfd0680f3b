"""``cost_profile=`` as users give it: a measured profile file, or ``roofline:NAME`` (a projection); and
the default when none is given: on an accelerator, a profile of this machine measured once and cached
(:func:`default_profile_path`), on the CPU the planner's built-in profile."""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import platformdirs

from ..errors import S2D2Error
from .measure import measure
from .mixed_steps import measure_mixed
from .step_cost import FittedCost, StepCost, calibrate, measured_profile, profile_key, roofline


def resolve_cost_profile(
    spec: str | os.PathLike[str] | None,
    adapter: Any,
    *,
    model_path: Path | None,
    model_name: str,
    shape: str | os.PathLike[str] | None = None,
) -> StepCost | None:
    """The step-cost profile ``spec`` names for this model.

    ``roofline:h200`` (or ``h100``, ``a100``) projects the model of ``shape`` (a config.json; default the
    model's own); a path is a measured profile: read when its key (model, device, dtype, threads) matches,
    else calibrated now (a few seconds of dummy forwards) and written there. ``None``: on the CPU, no
    profile (the step planner's built-in CPU profile, :data:`s2d2.cost.generic.GENERIC_COST`); on an
    accelerator, where a CPU's prices would make the planner choose as if forwards cost by the token, a
    measured profile of this machine, calibrated on first use and cached (:func:`default_profile_path`).
    """
    if spec is None:
        return _default_profile(adapter, model_path, model_name)
    text = str(spec)
    if text.startswith("roofline:"):
        config = shape if shape is not None else (model_path / "config.json" if model_path else None)
        if config is None:
            raise S2D2Error("a roofline profile needs the model's config.json (give --shape)")
        return roofline(text, config)
    if getattr(adapter, "fast", True) is None:
        raise S2D2Error("a measured cost profile times the lean forward; this model's architecture has none")
    return measured_profile(adapter, Path(text), profile_key(adapter, model_name), measure, measure_mixed)


def profile_cache_dir() -> Path:
    """Where measured profiles are cached: ``$S2D2_CACHE_DIR``, else the user's cache folder for s2d2."""
    env = os.environ.get("S2D2_CACHE_DIR")
    return Path(env) if env else platformdirs.user_cache_path("s2d2")


def default_profile_path(key: dict[str, Any], model_path: Path | None) -> Path:
    """The cache file of the measured profile with ``key`` (model, device, dtype, threads) for the model
    read from ``model_path``: a readable name and a digest of both."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(key.get(k)) for k in sorted(key)))[-80:]
    where = str(model_path.resolve()) if model_path is not None else ""
    digest = hashlib.sha256(json.dumps([key, where], sort_keys=True).encode()).hexdigest()[:12]
    return profile_cache_dir() / "cost-profiles" / f"{readable}-{digest}.json"


def _default_profile(adapter: Any, model_path: Path | None, model_name: str) -> StepCost | None:
    """The cached profile of this accelerator, measured when missing (see :func:`resolve_cost_profile`).
    The default must not stop a load: when measuring fails the planner keeps its built-in profile, and a
    cache folder that cannot be written only costs the next load a new measurement (each with a warning)."""
    device = getattr(adapter, "device", None)
    if device is None or device.type == "cpu" or getattr(adapter, "fast", True) is None:
        return None
    key = profile_key(adapter, model_name)
    path = default_profile_path(key, model_path)
    try:
        cached = FittedCost.load(path) if path.is_file() else None
    except S2D2Error:  # an unreadable cache entry (ours, not a user's file): measured again below
        cached = None
    if cached is not None and cached.key == key:
        return cached
    try:
        prof = calibrate(adapter, key, measure, mixed=measure_mixed)
    except (RuntimeError, S2D2Error) as exc:  # e.g. out of device memory
        warnings.warn(
            f"measuring a step-cost profile failed ({type(exc).__name__}); the planner uses its built-in"
            " CPU profile (give cost_profile= / --cost-profile to choose one)",
            stacklevel=2,
        )
        return None
    try:
        prof.save(path)
    except S2D2Error as exc:
        warnings.warn(f"the step-cost profile is not cached: {exc}", stacklevel=2)
    return prof

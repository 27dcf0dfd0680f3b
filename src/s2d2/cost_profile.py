"""``cost_profile=`` as users give it: a measured profile file, or ``roofline:NAME`` (a projection); and
the default when none is given: on an accelerator, a profile of this machine measured once and cached
(:func:`default_profile_path`), on the CPU the planner's built-in profile."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import platformdirs

from .engine.cost import StepCost, calibrate, measured_profile, profile_key, roofline
from .errors import S2D2Error
from .forward_cost import measure


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
    profile (the step planner's built-in CPU profile, :data:`s2d2.engine.planner.GENERIC_COST`); on an
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
    return measured_profile(adapter, Path(text), profile_key(adapter, model_name), measure)


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
    device = getattr(adapter, "device", None)
    if device is None or device.type == "cpu" or getattr(adapter, "fast", True) is None:
        return None
    key = profile_key(adapter, model_name)
    path = default_profile_path(key, model_path)
    try:
        return measured_profile(adapter, path, key, measure)
    except S2D2Error:  # an unreadable cache entry (ours, not a user's file): measure again over it
        prof = calibrate(adapter, key, measure)
        prof.save(path)
        return prof

"""``cost_profile=`` as users give it: a measured profile file, or ``roofline:NAME`` (a projection)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .engine.cost import StepCost, measured_profile, profile_key, roofline
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
    else calibrated now (a few seconds of dummy forwards) and written there.
    """
    if spec is None:
        return None
    text = str(spec)
    if text.startswith("roofline:"):
        config = shape if shape is not None else (model_path / "config.json" if model_path else None)
        if config is None:
            raise S2D2Error("a roofline profile needs the model's config.json (give --shape)")
        return roofline(text, config)
    if getattr(adapter, "fast", True) is None:
        raise S2D2Error("a measured cost profile times the lean forward; this model's architecture has none")
    return measured_profile(adapter, Path(text), profile_key(adapter, model_name), measure)

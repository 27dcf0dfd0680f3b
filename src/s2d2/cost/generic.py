"""The step planner's built-in prices: the profile it decides with when none was measured, and the
host milliseconds it adds to a measured profile's forwards.

The figures live in ``generic-cpu.json`` beside this file (measured on the built-in tiny-gsm model on
one CPU thread; BENCHMARKS.md says how), not in code.
"""

from __future__ import annotations

import json
from importlib import resources

from .step_cost import FittedCost

_FILE = resources.files(__package__).joinpath("generic-cpu.json")
_DATA = json.loads(_FILE.read_text(encoding="utf-8"))

#: The profile used without one (``ms = a + b rows + c tokens + d padded attention / 1000``); only speed
#: depends on it, never tokens.
GENERIC_COST = FittedCost(tuple(float(c) for c in _DATA["coef"]), {"model": _DATA["model"]})
#: Host milliseconds a pre-draft group adds to a step (its device math), charged with a measured profile
#: (:class:`~.step_cost.FittedCost`), whose forwards run on the same host.
HOST_MS_PER_GROUP: float = float(_DATA["host_ms_per_group"])
#: Host milliseconds per row of a step outside the forward, charged with a measured profile.
HOST_MS_PER_ROW: float = float(_DATA["host_ms_per_row"])
#: Host milliseconds per row of an AR step outside the forward (no draft or verification to register),
#: charged with a measured profile.
HOST_MS_PER_AR_ROW: float = float(_DATA.get("host_ms_per_ar_row", HOST_MS_PER_ROW))
#: Host milliseconds of a step outside the forward whatever its rows, charged with a measured profile.
HOST_MS_PER_STEP: float = float(_DATA.get("host_ms_per_step", 0.0))

"""Module paths that moved in the package reorganisation, kept importable for one release.

``import s2d2.throughput`` (and ``from s2d2 import throughput``) still work and give the module at its
new place, with a :class:`DeprecationWarning` naming it. Nothing in s2d2 imports an old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

#: Old dotted path -> new dotted path (to be removed in the release after 0.2).
MOVED: dict[str, str] = {
    "s2d2.throughput": "s2d2.bench.throughput",
    "s2d2.throughput_table": "s2d2.bench.throughput_table",
    "s2d2.likelihoods": "s2d2.scoring.likelihoods",
    "s2d2.cost_profile": "s2d2.cost.profile",
    "s2d2.forward_cost": "s2d2.cost.measure",
    "s2d2.metrics": "s2d2.intervals",
    "s2d2.tuning.preset_file": "s2d2.presets",
    "s2d2.engine.cost": "s2d2.cost.step_cost",
    "s2d2.engine.scorer": "s2d2.scoring.scorer",
    "s2d2.engine.runner": "s2d2.engine.model_runner",
    "s2d2.engine.step_math": "s2d2.engine.step.device_math",
    "s2d2.engine.row_queries": "s2d2.engine.step.row_queries",
    "s2d2.engine.device": "s2d2.engine.step.device",
    "s2d2.engine.fusion": "s2d2.engine.step.fusion",
    "s2d2.bench.runner": "s2d2.bench.grid_run",
    "s2d2.evaluation.runner": "s2d2.evaluation.eval_loop",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at the new one (the same module object)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        message = f"{spec.name} moved to {new}; the old path goes in the next release"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, executed already."""


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())

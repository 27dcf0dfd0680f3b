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
    "s2d2.engine.step_math": "s2d2.engine.step.device_math",
    "s2d2.engine.row_queries": "s2d2.engine.step.row_queries",
    "s2d2.engine.device": "s2d2.engine.step.device",
    "s2d2.engine.fusion": "s2d2.engine.step.fusion",
    "s2d2.bench.runner": "s2d2.bench.grid_run",
    "s2d2.evaluation.runner": "s2d2.evaluation.eval_loop",
    "s2d2.engine.model_runner": "s2d2.engine.runner.model_runner",
    "s2d2.engine.fault_isolation": "s2d2.engine.runner.fault_isolation",
    "s2d2.engine.step_plan": "s2d2.engine.step.plans",
    "s2d2.adapters": "s2d2.families",
    "s2d2.adapters.sdar": "s2d2.families.sdar",
    "s2d2.adapters.fast_dllm_v2": "s2d2.families.fast_dllm_v2",
    "s2d2.adapters.llada2": "s2d2.families.llada2",
    "s2d2.adapters.hf": "s2d2.families.hf",
    "s2d2.adapters.checkpoint": "s2d2.families.checkpoint",
    "s2d2.adapters.base": "s2d2.families.base",
    "s2d2.adapters.forward_batch": "s2d2.forward.forward_batch",
    "s2d2.adapters.describe": "s2d2.forward.describe",
    "s2d2.adapters.fastpath": "s2d2.forward.fastpath",
    "s2d2.adapters.paged_forward": "s2d2.forward.paged_forward",
    "s2d2.adapters.kv_pool": "s2d2.forward.kv_pool",
    "s2d2.adapters.kv_pages": "s2d2.forward.kv_pages",
    "s2d2.adapters.attention_groups": "s2d2.forward.attention_groups",
    "s2d2.adapters.span_attention": "s2d2.forward.span_attention",
    "s2d2.adapters.span_attention_kernel": "s2d2.forward.span_attention_kernel",
    "s2d2.adapters.graph_runner": "s2d2.forward.graph_runner",
    "s2d2.adapters.small_ops": "s2d2.forward.small_ops",
    "s2d2.adapters.masks": "s2d2.forward.masks",
    "s2d2.adapters.segment": "s2d2.forward.segment",
    "s2d2.adapters.host_lists": "s2d2.forward.host_lists",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at the new one (the same module object)."""

    def __init__(self) -> None:
        self._specs: dict[str, ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        message = f"{spec.name} moved to {new}; the old path goes in the next release"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, executed already: it keeps its own spec (the import set the alias's)."""
        module.__spec__ = self._specs.get(module.__name__, module.__spec__)


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        # first: an old package's path (``s2d2.adapters``, now ``s2d2.families``) would otherwise let the
        # path finder load a moved submodule a second time under its old name
        sys.meta_path.insert(0, _Alias())

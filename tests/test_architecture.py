"""The package's import graph: no cycle, and no import pointing up the layers (docs/ARCHITECTURE.md).

Every ``import`` and ``from ... import`` in ``src/s2d2`` counts, including those inside functions. Importing
``a.b.c`` also runs the packages ``a.b`` and ``a`` first, so those count as edges too (except the root
package, whose ``__init__`` is the public face and is always loaded first, and the importer's own
packages, which are running already).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "s2d2"

#: Layers, bottom (0) to top. A module may import modules of its own layer or below. The first matching
#: prefix (longest first) gives a module's layer.
LAYERS: dict[str, int] = {
    "s2d2.errors": 0,
    "s2d2.files": 0,
    "s2d2.intervals": 0,
    "s2d2.presets": 0,
    "s2d2.version": 0,
    "s2d2.setting_ranges": 0,
    "s2d2.setting_checks": 0,
    "s2d2.word_pieces": 0,
    # static checks on program text (pure: imports nothing of the package)
    "s2d2.codecheck": 0,
    "s2d2.config": 1,
    "s2d2.decoding": 2,
    # the model families and their loading sit on the forward's machinery, which knows no family
    "s2d2.families": 2,
    "s2d2.forward": 2,
    "s2d2.layouts": 2,
    "s2d2.constraints": 2,
    "s2d2.applicability": 2,
    "s2d2.model_source": 2,
    "s2d2.cost": 3,
    # a model over several processes: the ranks' processes, each loading its shard (families)
    "s2d2.parallel": 3,
    "s2d2.scoring": 3,
    # the engine, bottom to top: the row's state; the step and the scheduler; the planner and the runner;
    # the loop
    "s2d2.engine": 4,
    "s2d2.engine.step": 5,
    "s2d2.engine.scheduler": 5,
    "s2d2.engine.planner": 6,
    "s2d2.engine.runner": 6,
    "s2d2.engine.admission": 6,
    "s2d2.engine.llm_engine": 7,
    "s2d2.engine.__init__": 7,
    "s2d2.tasks": 8,
    "s2d2.model": 9,
    "s2d2.generation_result": 9,
    "s2d2.__init__": 9,
    "s2d2.tracing": 10,
    "s2d2.bench": 10,
    "s2d2.evaluation": 10,
    "s2d2.tuning": 10,
    "s2d2.training": 10,
    "s2d2.serving": 11,
    "s2d2.cli": 12,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / ROOT).rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_module(name: str) -> bool:
    return name in MODULES or f"{name}.__init__" in MODULES


def _key(name: str) -> str:
    """The ``MODULES`` key of an importable name (a package's is its ``__init__``)."""
    return name if name in MODULES else f"{name}.__init__"


def _package(mod: str) -> list[str]:
    parts = mod.split(".")
    return parts[:-1]  # a module's package (``__init__``'s too: its package is its own name)


def imports(mod: str) -> set[str]:
    """The s2d2 modules ``mod`` imports (keys of :data:`MODULES`), with their parent packages."""
    tree = ast.parse(MODULES[mod].read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(mod)[: len(_package(mod)) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != ROOT:
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            names.update(subs)
            if len(subs) < len(node.names):
                names.add(target)
    own = _package(mod)
    out = set()
    for name in names:
        parts = name.split(".")
        for i in range(2, len(parts) + 1):  # the packages on the way run first (not the root, nor mod's own)
            if _is_module(".".join(parts[:i])) and (i == len(parts) or parts[:i] != own[:i]):
                out.add(_key(".".join(parts[:i])))
    out.discard(mod)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def layer(mod: str) -> int:
    best = max((p for p in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return LAYERS[best]


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    assert "s2d2.decoding.policies" in GRAPH["s2d2.engine.request"]
    assert "s2d2.engine.step.__init__" in GRAPH["s2d2.engine.runner.model_runner"]  # via step.fusion
    assert "s2d2.cost.measure" in GRAPH["s2d2.cost.profile"]


def test_no_import_cycle():
    assert _cycles() == []


def test_no_upward_import():
    upward = sorted(
        f"{m} ({layer(m)}) -> {t} ({layer(t)})" for m, ts in GRAPH.items() for t in ts if layer(t) > layer(m)
    )
    assert upward == []


def test_every_module_has_a_layer():
    assert all(any(m == p or m.startswith(p + ".") for p in LAYERS) for m in MODULES if m != "s2d2.__init__")


def test_the_forward_machinery_knows_no_family():
    """``forward/`` (batch description, paged KV, attention, graphs) serves every family and imports none."""
    into_families = sorted(
        f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("s2d2.forward.") for t in ts
        if t.startswith("s2d2.families")
    )
    assert into_families == []

"""Kernel-launching aten ops per forward: the launch-bound cost of the engine, counted on any device.

On a GPU a small forward costs its kernel launches, not its arithmetic. Counting the aten ops that
reach the dispatcher (a :class:`~torch.utils._python_dispatch.TorchDispatchMode` over a whole
``generate_batch``) and dividing by the forwards run gives the same figure on the CPU, where CI can
guard it. View and metadata ops launch nothing and are left out (:data:`METADATA_OPS`), as are ops
that return their input unchanged (``to`` the same dtype and device).

    python -m s2d2.bench.op_count [--rows 1,64] [--configs ar,lossless-auto] [--n N] [--max-new-tokens M]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Aten ops that only make a new view or read metadata: no kernel runs for them (the issue's list, with
#: the aten names the same calls reach the dispatcher under).
METADATA_OPS = frozenset([
    "view", "t", "transpose", "expand", "slice", "select", "squeeze", "unsqueeze", "permute", "as_strided",
    "alias", "detach", "reshape", "split", "unbind", "narrow", "_unsafe_view", "view_as", "_reshape_alias",
    "split_with_sizes", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_same_size",
])  # fmt: skip


def _base_name(func: Any) -> str:
    """``aten.view.default`` -> ``view``; ``aten.mul_.Tensor`` -> ``mul_``."""
    return func.overloadpacket.__name__


def launches(func: Any) -> bool:
    """Whether the aten op ``func`` runs a kernel (is not a view or metadata op)."""
    name = _base_name(func)
    base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    return name not in METADATA_OPS and base not in METADATA_OPS


def _returns_an_input(func: Any, out: Any, args: Sequence[Any]) -> bool:
    """Whether a non-mutating op returned one of its inputs itself: a no-op (``to`` the same dtype and
    device, ``resolve_conj`` of a plain tensor, ``contiguous`` of a contiguous one) that launched nothing."""
    if func._schema.is_mutable or not isinstance(out, torch.Tensor):
        return False
    return any(out is a for a in args)


class OpCounter(TorchDispatchMode):
    """Counts kernel-launching aten ops by name while active (``with OpCounter() as c: ...``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        if launches(func) and not _returns_an_input(func, out, args):
            self.counts[_base_name(func)] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class OpCount:
    """Ops per forward of one run: ``ops`` counted, ``forwards`` run, the commonest ops by name."""

    config: str
    rows: int
    ops: int
    forwards: int
    layers: int
    top: list[tuple[str, int]] = field(default_factory=list)

    @property
    def per_forward(self) -> float:
        return self.ops / max(self.forwards, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "rows": self.rows, "ops_per_forward": round(self.per_forward, 1),
                "forwards": self.forwards, "layers": self.layers, "top": self.top}  # fmt: skip


def count_generate(model: Any, prompts: Sequence[Any], config: str, rows: int, **settings: Any) -> OpCount:
    """Ops per forward of ``model.generate_batch(prompts)`` under the bench configuration ``config``
    (:func:`~s2d2.bench.throughput.pick_configs`, spelled against the library's defaults as ``s2d2
    bench-batch`` does) on a fresh engine of ``rows`` rows (made before counting: its set-up is no
    step's)."""
    from .throughput import pick_configs

    (bench,) = pick_configs([config])
    cfg = model.make_config(model.checkpoint_config(), **bench.expanded(), seed=0, **settings)
    model.max_num_seqs = rows
    model._engine = None
    engine = model.engine
    before = engine.stats()["forwards"]
    with torch.inference_mode(), OpCounter() as counter:
        model.generate_batch(list(prompts), cfg)
    forwards = engine.stats()["forwards"] - before
    layers = int(getattr(model.adapter.model.config, "num_hidden_layers", 0))
    return OpCount(config, rows, counter.total, forwards, layers, counter.counts.most_common(12))


def main(argv: Sequence[str] | None = None) -> None:
    import json

    from .. import load
    from .suites import load_problems

    p = argparse.ArgumentParser(prog="python -m s2d2.bench.op_count", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-gsm")
    p.add_argument("--rows", default="1,64")
    p.add_argument("--configs", default="ar,lossless-auto")
    p.add_argument("--n", type=int, default=64, help="prompts per run")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    model = load(a.model, enforce_eager=True)  # the eager forward's ops (a replay dispatches none)
    prompts = [model.encode(p["question"]) for p in load_problems("tiny-gsm", "test", a.n)]
    out = []
    for cfg in a.configs.split(","):
        for rows in (int(r) for r in a.rows.split(",")):
            c = count_generate(model, prompts, cfg, rows, max_new_tokens=a.max_new_tokens)
            out.append(c.to_dict())
            print(f"{cfg:>16} rows {rows:>3}: {c.per_forward:7.1f} ops/forward over {c.forwards} forwards"
                  f" ({c.layers} layers); top {c.top[:6]}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

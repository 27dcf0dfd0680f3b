"""A second "device" on the CPU: tensors the engine puts on the model's device refuse host tensors.

:class:`DeviceTensor` marks what the step keeps on the device (the forward's logits and everything made
from them, and what :class:`EmulatedDeviceOps` makes: index tensors, uniforms). Any op that mixes a
marked tensor with an unmarked (host) tensor, or draws from a generator the device did not make,
raises :class:`DeviceMixError`, as CUDA would raise a device mismatch. Reading values on the host
(``tolist``, ``item``, ``int()``, ``bool()``, ``float()``, ``cpu``, ``numpy``) is allowed only through
the engine's one door (:meth:`DeviceOps.to_host`); elsewhere it raises too, so a hidden host
synchronisation cannot slip in. Every exit is counted.

Installed for a whole test run with ``S2D2_EMULATED_DEVICE=1`` (see ``conftest.py``), or per test with
:func:`installed`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

from s2d2.engine import llm_engine
from s2d2.engine.step.device import DeviceOps


class DeviceMixError(RuntimeError):
    """A host tensor met a device tensor (or a host generator drew device values)."""


class _State:
    exits = 0
    door_open = False
    generators: weakref.WeakSet = weakref.WeakSet()


STATE = _State()

_EXITS = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
}
_HARMLESS = {torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__str__}


def _tensors(obj: object) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated device (see the module docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _EXITS:
            if not STATE.door_open:
                raise DeviceMixError(f"host synchronisation outside DeviceOps.to_host: {func.__name__}")
            STATE.exits += 1
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in _HARMLESS:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        for t in _tensors((args, kwargs)):
            if not isinstance(t, DeviceTensor):
                raise DeviceMixError(
                    f"{getattr(func, '__name__', func)}: a host tensor {tuple(t.shape)} met a device tensor"
                )
        gen = kwargs.get("generator")
        if gen is not None and gen not in STATE.generators:
            raise DeviceMixError(f"{getattr(func, '__name__', func)}: a host generator drew device values")
        return super().__torch_function__(func, types, args, kwargs)


def _mark(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(DeviceTensor)


_FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.eye,
}


class _DeviceFactories(TorchFunctionMode):
    """During the step's device half, a tensor made with an explicit ``device=`` is on the device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("device") is not None and isinstance(out, torch.Tensor):
            return _mark(out)
        return out


class EmulatedDeviceOps(DeviceOps):
    """The engine's device on the emulated device: what it makes is marked, its door counts."""

    def tensor(self, data, dtype=torch.long):
        return _mark(super().tensor(data, dtype))

    def arange(self, n):
        return _mark(super().arange(n))

    def from_host(self, t):
        return _mark(super().from_host(t))

    def rand(self, n, generator):
        return _mark(super().rand(n, generator))

    def generator(self, seed):
        g = super().generator(seed)
        STATE.generators.add(g)
        return g

    def mark(self, t):
        return _mark(t)

    def phase(self):
        return _DeviceFactories()

    def _fetch(self, flat):
        STATE.door_open = True
        try:
            return flat.tolist()
        finally:
            STATE.door_open = False


@contextlib.contextmanager
def installed() -> Iterator[_State]:
    """Engines created inside run on the emulated device."""
    real = llm_engine.DeviceOps
    llm_engine.DeviceOps = EmulatedDeviceOps
    try:
        yield STATE
    finally:
        llm_engine.DeviceOps = real


def install() -> None:
    """For the whole process (``S2D2_EMULATED_DEVICE=1``)."""
    llm_engine.DeviceOps = EmulatedDeviceOps

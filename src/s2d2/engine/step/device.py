"""Where the step's tensors live, and the one door between the model's device and the host.

The decode step keeps everything it computes from a forward's logits on the model's device and brings
the small per-step results to the host through :meth:`DeviceOps.to_host`, which counts every transfer
(``host_transfers``). Tensors the step makes itself (index tensors, uniforms, generators) come from the
same object, so they are created on the model's device. A test subclass (``tests/emulated_device.py``)
marks these tensors and refuses to let them meet host tensors, which is how CI catches what CUDA would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from ...forward.host_lists import long_tensor

#: Token ids travel to the host as float32 (:meth:`DeviceOps.to_host`): exact below this.
MAX_VOCAB = 2**24


def _as_float32(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``parts`` ready to be concatenated into one tensor whose values read back as float32 would. Parts
    that are all integer or bool are left as they are (their values come back exact, as ints); where one
    part is float32 and the others are integer or bool, they are left too: ``torch.cat`` promotes them
    to float32 as ``.to(torch.float32)`` would (one op instead of a conversion a part); other floating
    parts (float64, half precision) are converted first."""
    f32 = torch.float32
    dtypes = [p.dtype for p in parts]
    floating = [d for d in dtypes if d.is_floating_point]
    if not floating or all(d == f32 for d in floating):
        return parts
    return [p if d == f32 else p.to(f32) for p, d in zip(parts, dtypes, strict=True)]


class DeviceOps:
    """Tensor factories on one device, and the counted transfer of results to the host."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        #: device -> host transfers made through :meth:`to_host` (each one waits for the device)
        self.host_transfers = 0

    # ------------------------------------------------------------------ made on the device
    def tensor(self, data: Sequence[int] | Sequence[float], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """``data`` (host values) as a tensor on the device (a host-to-device copy, no wait)."""
        if dtype == torch.long and isinstance(data, list):
            return long_tensor(data).to(self.device)
        return torch.tensor(data, dtype=dtype, device=self.device)

    def from_host(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor copied to the device (no wait): the step's grammar bitmask, one a step."""
        return t.to(self.device, non_blocking=True)

    def arange(self, n: int) -> torch.Tensor:
        """``[n]`` long tensor 0..n-1 on the device."""
        return torch.arange(n, device=self.device)

    def generator(self, seed: int) -> torch.Generator:
        """A random generator on the device, seeded with ``seed``."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def rand(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``[n]`` uniforms in [0, 1) drawn from ``generator`` on the device."""
        return torch.rand(n, generator=generator, device=self.device)

    def phase(self) -> contextlib.AbstractContextManager[None]:
        """Entered around the step's device half (code there may make tensors with ``device=``)."""
        return contextlib.nullcontext()

    def mark(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor the model produced (its logits), as the step's device tensors are represented."""
        return t

    # ------------------------------------------------------------------ the way out
    def to_host(self, parts: Sequence[torch.Tensor]) -> list[list[float]]:
        """Every tensor of ``parts`` flattened, brought to the host in ONE transfer, as Python lists.

        Values travel as float32 (probabilities and logprobs are float32 already), so token ids come back
        exact below 2**24 (as floats: ``int()`` them); the engine refuses larger vocabularies. A transfer
        of integer parts only (token ids, counts) keeps their dtype: its values come back as ints.
        """
        if not parts:
            return []
        self.host_transfers += 1
        flat_parts = [p if p.dim() == 1 else p.reshape(-1) for p in parts]
        sizes = [p.numel() for p in flat_parts]
        ready = _as_float32(flat_parts)
        values = self._fetch(ready[0] if len(ready) == 1 else torch.cat(ready))
        out, at = [], 0
        for n in sizes:
            out.append(values[at : at + n])
            at += n
        return out

    def _fetch(self, flat: torch.Tensor) -> list[float]:
        return flat.tolist()


class Fetch:
    """Tensors waiting for the step's one transfer; each registration returns its index."""

    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []
        self.values: list[list[float]] = []
        self._ints: dict[int, list[int]] = {}

    def add(self, t: torch.Tensor) -> int:
        self.parts.append(t)
        return len(self.parts) - 1

    def get(self, i: int) -> list[float]:
        return self.values[i]

    def ints(self, i: int) -> list[int]:
        """Part ``i`` as ints (token ids), converted once however many queries read it."""
        if i not in self._ints:
            self._ints[i] = list(map(int, self.values[i]))
        return self._ints[i]

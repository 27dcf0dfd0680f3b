"""The devices a roofline projects onto: each one's data-sheet figures (compute, memory bandwidth,
memory size) and its interconnect to the other GPUs of its node (NVLink), with the share of them a
decode step reaches.

Figures are the vendors' public data sheets (NVIDIA H200, H100 and A100 SXM), except the latency of
one collective, which no data sheet gives: it is an assumption (see :data:`COLLECTIVE_LATENCY_S`).
Measured values, where any exist, belong in the documentation beside the projections, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Latency of one all-reduce across the GPUs of one NVLink/NVSwitch node, seconds, whatever its size is
#: (the fixed part of a collective: launch, synchronisation, the first hop). An assumption, not a
#: data-sheet figure: the order of magnitude NCCL's small-message all-reduce takes within one node.
COLLECTIVE_LATENCY_S = 10e-6


@dataclass(frozen=True)
class Hardware:
    """A device's data-sheet figures and the share of them a decode step reaches."""

    name: str
    #: dense bf16 tensor FLOP/s and memory bytes/s
    peak_flops: float
    bandwidth: float
    #: fixed cost of one forward (launches, small ops), seconds
    overhead_s: float = 40e-6
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    #: device memory, bytes, and the share of it weights and KV may take (the rest: the CUDA context,
    #: activations, the collective library's buffers)
    memory_bytes: float = 80e9
    memory_usable: float = 0.9
    #: NVLink bandwidth per GPU in one direction, bytes/s (a ring all-reduce's bus bandwidth ceiling)
    nvlink_bandwidth: float = 450e9
    nvlink_efficiency: float = 0.8
    #: fixed cost of one collective, seconds (:data:`COLLECTIVE_LATENCY_S`)
    collective_latency_s: float = COLLECTIVE_LATENCY_S

    def all_reduce_s(self, nbytes: float, ranks: int) -> float:
        """One ring all-reduce of ``nbytes`` (each rank's buffer) over ``ranks`` GPUs: its latency plus
        2 (N - 1) / N of the buffer over the reached NVLink bandwidth; 0 on one GPU."""
        if ranks <= 1:
            return 0.0
        wire = 2 * (ranks - 1) / ranks * nbytes
        return self.collective_latency_s + wire / (self.nvlink_bandwidth * self.nvlink_efficiency)


#: Data-sheet figures (NVIDIA's product data sheets, SXM parts):
#: H200 SXM: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 141 GB, NVLink 4 at 900 GB/s per GPU (both
#: directions together: 450 GB/s each way);
#: H100 SXM: 989 TFLOP/s, 3.35 TB/s HBM3, 80 GB, NVLink 4 at 900 GB/s;
#: A100 80GB SXM: 312 TFLOP/s, 2.04 TB/s HBM2e, 80 GB, NVLink 3 at 600 GB/s (300 GB/s each way).
HARDWARE: dict[str, Hardware] = {
    "h200": Hardware("h200", 989e12, 4.8e12, memory_bytes=141e9, nvlink_bandwidth=450e9),
    "h100": Hardware("h100", 989e12, 3.35e12, memory_bytes=80e9, nvlink_bandwidth=450e9),
    "a100": Hardware("a100", 312e12, 2.039e12, memory_bytes=80e9, nvlink_bandwidth=300e9),
}

__all__ = ["COLLECTIVE_LATENCY_S", "HARDWARE", "Hardware"]

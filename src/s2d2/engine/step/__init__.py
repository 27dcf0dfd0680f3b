"""One decode step after the forward: the device half (everything computed from the logits, batched
over rows, brought to the host in one transfer) and the host half (the block loop, routing, fused
verification's groups, commits).

:func:`queries` says what each row needs from its logits, :func:`run_queries` computes it on the device,
:func:`apply` and :func:`advance` turn the results into each row's next state.
"""

from .device import MAX_VOCAB, DeviceOps
from .device_math import DraftQuery, VerifyQuery, run_queries
from .host import advance, apply
from .row_queries import RowWork, queries

__all__ = [
    "MAX_VOCAB",
    "DeviceOps",
    "DraftQuery",
    "RowWork",
    "VerifyQuery",
    "advance",
    "apply",
    "queries",
    "run_queries",
]

"""One decode step after the forward: the device half (everything computed from the logits, batched
over rows, brought to the host in one transfer) and the host half (the block loop, routing, fused
verification's groups, commits).

:func:`queries` says what each row needs from its logits, :func:`run_queries` computes it on the device,
:func:`apply` and :func:`advance` turn the results into each row's next state (:func:`recomputed` for a
preempted row rewriting its cache); :func:`apply_plans` applies the step planner's plans before the
forward.
"""

from .device import MAX_VOCAB, DeviceOps
from .device_math import DraftQuery, VerifyQuery, run_queries
from .host import advance, apply, recomputed
from .plans import apply_plans
from .row_queries import RowWork, queries

__all__ = [
    "MAX_VOCAB",
    "DeviceOps",
    "DraftQuery",
    "RowWork",
    "VerifyQuery",
    "advance",
    "apply",
    "apply_plans",
    "queries",
    "recomputed",
    "run_queries",
]

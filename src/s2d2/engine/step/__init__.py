"""One decode step after the forward: the device half (everything computed from the logits, batched
over rows, brought to the host in one transfer) and the host half (the block loop, routing, fused
verification's groups, commits).

What the engine calls: :func:`advance` (the block loop, before the forward), :func:`apply_plans` (the
step planner's plans), :func:`steady` and :func:`predraft_inputs` (what the runner lays out),
:func:`after_forward` (the step after the forward, one loop over the batch: :mod:`.postprocess`) and
:func:`check_progress`. Inside, :func:`queries` says what each row needs from its logits,
:func:`run_queries` computes it on the device, :func:`apply` turns the results into each row's next state
(:func:`recomputed` for a preempted row rewriting its cache).
"""

from .device import MAX_VOCAB, DeviceOps
from .device_math import DraftQuery, VerifyQuery, run_queries
from .fusion import predraft_inputs
from .host import advance, apply, recomputed
from .lanes import steady
from .plans import apply_plans
from .postprocess import after_forward
from .progress import check_progress
from .row_queries import RowWork, queries

__all__ = [
    "MAX_VOCAB",
    "DeviceOps",
    "DraftQuery",
    "RowWork",
    "VerifyQuery",
    "advance",
    "after_forward",
    "apply",
    "apply_plans",
    "check_progress",
    "predraft_inputs",
    "queries",
    "recomputed",
    "run_queries",
    "steady",
]

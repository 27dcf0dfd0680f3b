"""The runner: turns the running rows into one batched forward and runs it, touching no request.

:class:`ModelRunner` builds each row's part of the step's forward (:class:`~..row_forward.RowForward`, writing
nothing) and runs the batch on the adapter; :func:`run_isolating_failures` pins a failing forward on the
rows that cause it, so that only they fail.
"""

from .fault_isolation import run_isolating_failures
from .model_runner import ModelRunner

__all__ = ["ModelRunner", "run_isolating_failures"]

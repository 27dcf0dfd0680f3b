"""The cost-aware step planner (``plan="auto"``, preset ``lossless-auto``), behind one face.

The engine enters it through these names only: :class:`StepPlanner` (each step, every planned row's
verification or draft forward), :func:`planned_config` and :func:`halfway_context` (the block size a
request decodes with, chosen at admission) and :func:`fixed_config` (whether a request is planned step by
step at all, chosen at admission). Everything else in the package is its own arithmetic.
"""

from .block_size import halfway_context, planned_config
from .regime import fixed_config
from .step_planner import StepPlanner

__all__ = ["StepPlanner", "fixed_config", "halfway_context", "planned_config"]

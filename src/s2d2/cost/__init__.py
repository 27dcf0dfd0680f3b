"""What a forward and an engine step cost: the cost model (:mod:`.step_cost`), measuring forwards
(:mod:`.measure`; steps shaped like the engine's: :mod:`.mixed_steps`), cached per-machine profiles
(:mod:`.profile`), the planner's host-timed view
(:mod:`.host_timed`) and the built-in profile without a measurement (:mod:`.generic`).

Only the cost model is imported here; measuring loads model code, so import :mod:`.measure` and
:mod:`.profile` where they are used.
"""

from .step_cost import FittedCost, StepCost, StepShape, roofline

__all__ = ["FittedCost", "StepCost", "StepShape", "roofline"]

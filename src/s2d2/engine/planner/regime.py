"""Whether a planned request is planned step by step at all, chosen by load when it is added.

The step planner (:mod:`.planner`) buys fewer forwards with extra query tokens: the AR lead in a draft
forward, pre-draft groups in a fused verification, a shorter or a repeated verification. That pays
where a forward's cost hardly depends on its query tokens, and it costs host time besides: the
acceptance estimates every draft computes for it, the planning itself, and the draft and verification
groups its rows' different phases give every step. Where the profile prices most of a forward by its
query tokens (a CPU past a few rows, a GPU past its compute ridge), the extra tokens buy nothing and the
host time is lost: a plain fixed verification of every drafted block, in lockstep, is faster.

So a request of the lossless family with ``plan="auto"`` is planned step by step while the fixed part of
a plain draft forward at its load (what the forward costs with no query tokens, over what it costs with
its ``B + 1`` a row) is at least :data:`MIN_FIXED_SHARE`; below it, it decodes as the plain lossless
configuration of its block size (``plan="fixed"``, no fusion). Either way its tokens are AR greedy's.
Host time is only weighed with a measured profile (:class:`~.cost.FittedCost`, whose forwards run on
this host): a projection (a roofline) charges forwards alone, so there every request is planned.
"""

from __future__ import annotations

from ...config import DecodeConfig
from ...cost.step_cost import StepCost
from .block_size import forward_ms

#: The least fixed share of a plain draft forward at which step-by-step planning pays: set between the
#: loads where planning was measured ahead of lossless B8 on the built-in model's CPU (1 and 2 rows,
#: about even at 4) and behind it (from 16; BENCHMARKS.md, issue 25). The built-in CPU profile's share
#: at block size 8 (72 cached positions a row) falls from 0.82 at 1 row to 0.57 at 4, 0.44 at 8 and
#: 0.34 at 16.
MIN_FIXED_SHARE = 0.5


def fixed_share(cost: StepCost, rows: int, block_size: int, context: int) -> float:
    """The share of a plain draft forward's predicted ms (``rows`` rows alike, ``block_size + 1`` query
    tokens each after ``context`` cached positions) that does not depend on its query tokens."""
    full = forward_ms(cost, rows, block_size + 1, context)
    return forward_ms(cost, rows, 0, context) / full if full > 0 else 1.0


def plans_step_by_step(
    cost: StepCost, rows: int, block_size: int, context: int, min_share: float = MIN_FIXED_SHARE
) -> bool:
    """Whether a planned request sharing steps with ``rows`` rows is planned step by step: the fixed
    share of its draft forward is at least ``min_share`` (see the module docstring)."""
    return fixed_share(cost, max(1, rows), block_size, max(0, context)) >= min_share


def fixed_config(config: DecodeConfig) -> DecodeConfig:
    """``config`` decoded as the plain lossless configuration of its block size: no step planning, no
    fusion (the same tokens: AR greedy's)."""
    return config.replace(plan="fixed", fuse=False, plan_block_sizes=())

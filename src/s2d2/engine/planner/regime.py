"""How a request of the lossless family with ``plan="auto"`` decodes, chosen by load when it is added:
AR, plain lossless at a block size, or planned step by step at a block size.

Every way commits AR greedy's tokens (AR only for greedy settings), so the choice changes speed only.
The cycle model (:mod:`.cycle`) prices AR and plain lossless at each offered block size per committed
token at the load the request joins; the cheapest is kept, with hysteresis (:class:`.cycle.CycleChoice`).
Where that is AR (a forward past its compute ridge: every query token costs, and drafting only adds
them), the request decodes as AR. Otherwise it is planned step by step only at a block size where
planning can pay, and is worth it against the best plain choice:

- the step planner (:mod:`.step_planner`) buys fewer forwards with extra query tokens (the AR lead,
  pre-draft groups, a shorter or a repeated verification), and it costs host time besides (the
  acceptance estimates, the planning, the draft and verification groups its rows' different phases give
  every step). That pays only where a forward's cost hardly depends on its query tokens: the fixed
  share of a plain draft forward at the load (what it costs with no query tokens, over what it costs
  with its ``B + 1`` a row) must be at least :data:`MIN_FIXED_SHARE`;
- with this host's time in the prices (a measured profile), the size priced best plain among those must
  be within :data:`PLAN_GAIN` of the best plain choice (what planning gains over plain decoding at its
  size, measured; the cycle model's fused price does not capture it on the CPU);
- with a projection (a roofline: forwards alone, no host time), the fused cycle of the one priced
  cheapest must be :data:`~.cycle.PLAN_MARGIN` cheaper than the best plain choice
  (:func:`.cycle.planned_price`).

Else it decodes as the plain lossless configuration of the best plain block size (``plan="fixed"``, no
fusion), in lockstep with its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...config import DecodeConfig
from ...cost.step_cost import StepCost
from .block_size import forward_ms, halfway_context
from .cycle import AR, PLAN_MARGIN, CycleChoice, planned_price, prices
from .stats import PlannerStats

#: The least fixed share of a plain draft forward at which step-by-step planning pays: set between the
#: loads where planning was measured ahead of lossless B8 on the built-in model's CPU (one row) and
#: behind it (from 4 rows; BENCHMARKS.md). The built-in CPU profile's share at block size 8
#: (72 cached positions a row) falls from 0.82 at 1 row to 0.69 at 2 and 0.57 at 4.
MIN_FIXED_SHARE = 0.75
#: What step-by-step planning at a block size where it can pay is taken to gain over plain decoding at
#: that size, with this host's time (a measured profile): on the built-in model's CPU at one row,
#: planned B8 measured 0.95 / 1.20 / 1.15x plain B8 in three quiet runs (BENCHMARKS.md). The
#: cycle model's fused price does not capture it there (the planner's choices per step are not its
#: fixed fused cycle), so with host time that gain is what it is credited.
PLAN_GAIN = 0.10
#: Most memoised prices and settings an engine keeps (cleared past it)
MEMO = 4096


def fixed_share(cost: StepCost, rows: int, block_size: int, context: int) -> float:
    """The share of a plain draft forward's predicted ms (``rows`` rows alike, ``block_size + 1`` query
    tokens each after ``context`` cached positions) that does not depend on its query tokens."""
    full = forward_ms(cost, rows, block_size + 1, context)
    return forward_ms(cost, rows, 0, context) / full if full > 0 else 1.0


def plans_step_by_step(
    cost: StepCost, rows: int, block_size: int, context: int, min_share: float = MIN_FIXED_SHARE
) -> bool:
    """Whether the fixed share of a draft forward at ``rows`` rows is at least ``min_share``."""
    return fixed_share(cost, max(1, rows), block_size, max(0, context)) >= min_share


def fixed_config(config: DecodeConfig) -> DecodeConfig:
    """``config`` decoded as the plain lossless configuration of its block size: no step planning, no
    fusion (the same tokens: AR greedy's)."""
    return config.replace(plan="fixed", fuse=False, plan_block_sizes=())


def ar_config(config: DecodeConfig) -> DecodeConfig:
    """``config`` decoded as AR (greedy settings only: the same tokens)."""
    return config.replace(decoder="ar", plan="fixed", fuse=False, plan_block_sizes=())


@dataclass
class Decision:
    """How a request decodes: ``mode`` ``"ar"``, ``"fixed"`` or ``"planned"``, at ``block_size``."""

    mode: str
    block_size: int
    #: the cycle model's ms per committed token of each candidate (:data:`~.cycle.AR` for AR)
    priced: dict[int, float] = field(default_factory=dict)


@dataclass
class Regime:
    """The admission choice of one engine (see the module docstring)."""

    #: what the cycle model prices with (the planner's: with this host's time where measured here)
    cost: StepCost
    #: whether the prices include this host's time (a measured profile); a projection's do not
    host_timed: bool
    #: the forwards' profile alone, whose fixed share decides whether planning pays (default: ``cost``)
    share_cost: StepCost | None = None
    min_share: float = MIN_FIXED_SHARE
    choice: CycleChoice = field(default_factory=CycleChoice)
    _priced: dict[tuple, dict[int, float]] = field(default_factory=dict, repr=False)
    #: the size planning would take at a load (None: none can pay) and its price against the best plain
    #: choice's (a fused price with its margin on a projection; its plain price less PLAN_GAIN with host time)
    _fused: dict[tuple, tuple[int | None, float]] = field(default_factory=dict, repr=False)
    #: settings decided before: ``(id(config), mode, block size)`` -> (config, the decided settings)
    _configs: dict[tuple, tuple[DecodeConfig, DecodeConfig]] = field(default_factory=dict, repr=False)

    def settings(self, config: DecodeConfig, decision: Decision) -> DecodeConfig:
        """:func:`decided_config`, memoised for the same settings object (a batch shares one: a
        rebuild validates the settings, which costs more than the decision)."""
        key = (id(config), decision.mode, decision.block_size)
        hit = self._configs.get(key)
        if hit is not None and hit[0] is config:
            return hit[1]
        if len(self._configs) >= MEMO:
            self._configs.clear()
        out = decided_config(config, decision)
        self._configs[key] = (config, out)
        return out

    def decide(self, config: DecodeConfig, sizes: Sequence[int], n_prompt: int, rows: int) -> Decision:
        """The way a request of ``n_prompt`` prompt tokens under ``config`` decodes among block ``sizes``
        (those that fit the engine's limits) at ``rows`` rows in all."""
        context = halfway_context(n_prompt, config)
        key = (rows, context, tuple(sizes), config.temperature == 0, config.predraft_positions)
        if key not in self._priced:  # the same load and context price the same: computed once
            if len(self._priced) >= MEMO:
                self._priced.clear()
            priced = prices(self.cost, rows, sizes, context)
            if config.temperature != 0:
                priced.pop(AR)  # sampled: AR would draw other tokens
            self._priced[key] = priced
        priced = self._priced[key]
        if self.min_share <= 0:  # every request planned (the per-step planner's tests): a block size
            priced = {b: p for b, p in priced.items() if b != AR}
        best = self.choice.choose(priced)
        if best == AR:
            return Decision("ar", 1, priced)
        if self.min_share <= 0:  # every request planned: at the block size priced best
            return Decision("planned", best, priced)
        planned = self._planned(key, sizes, rows, context, config.predraft_positions, priced[best])
        if planned is not None:
            return Decision("planned", planned, priced)
        return Decision("fixed", best, priced)

    def _planned(
        self, key: tuple, sizes: Sequence[int], rows: int, context: int, predraft: int, plain: float
    ) -> int | None:
        """The block size to plan step by step at, or None (decode plain at the best plain size, priced
        ``plain`` ms a token). Candidates: the ``sizes`` where planning can pay
        (:func:`plans_step_by_step`). With this host's time, the one priced best plain, if within
        :data:`PLAN_GAIN` of ``plain`` (what planning was measured to gain over plain decoding at its
        size); on a projection, the one whose fused cycle is priced cheapest, if :data:`~.cycle.PLAN_MARGIN`
        cheaper than ``plain``."""
        fused_key = (*key, "planned")
        if fused_key not in self._fused:
            if len(self._fused) >= MEMO:
                self._fused.clear()
            share_cost = self.share_cost if self.share_cost is not None else self.cost
            can = [b for b in sizes if plans_step_by_step(share_cost, rows, b, context, self.min_share)]
            if self.host_timed:
                price = {b: self._priced[key][b] / (1.0 + PLAN_GAIN) for b in can}
            else:
                price = {
                    b: (1.0 + PLAN_MARGIN) * planned_price(self.cost, rows, b, context, predraft, 0.0)
                    for b in can
                }
            cheapest = min(price, key=lambda b: (price[b], b)) if price else None
            self._fused[fused_key] = (cheapest, price[cheapest] if price else 0.0)
        b, price = self._fused[fused_key]
        return b if b is not None and price <= plain else None


def decided_config(config: DecodeConfig, decision: Decision) -> DecodeConfig:
    """``config`` as ``decision`` says (settings rebuilt only where they change)."""
    if decision.mode == "ar":
        return ar_config(config)
    if decision.block_size != config.block_size:
        config = config.replace(block_size=decision.block_size)
    return fixed_config(config) if decision.mode == "fixed" else config


def admitted(
    regime: Regime,
    config: DecodeConfig,
    sizes: Sequence[int],
    n_prompt: int,
    rows: int,
    fits: Callable[[DecodeConfig], bool],
) -> tuple[DecodeConfig, Decision]:
    """``config`` decided by ``regime`` among ``sizes`` (``config.block_size`` alone where empty); a size
    whose settings do not ``fit`` the engine's limits gives way to the others (``block_size``'s own
    settings are not checked here: where they do not fit, their error stands)."""
    sizes = sorted(set(sizes) | {config.block_size})
    while True:
        decision = regime.decide(config, sizes, n_prompt, rows)
        if decision.mode == "ar" or decision.block_size == config.block_size:
            return regime.settings(config, decision), decision
        chosen = regime.settings(config, decision)
        if fits(chosen):
            return chosen, decision
        sizes = [s for s in sizes if s != decision.block_size]


def admit(
    regime: Regime,
    stats: PlannerStats,
    config: DecodeConfig,
    sizes: Sequence[int],
    n_prompt: int,
    rows: int,
    fits: Callable[[DecodeConfig], bool],
    forced: bool = False,
) -> DecodeConfig:
    """``config`` of a plan=auto request of the lossless family, decided for ``rows`` rows, counted in
    ``stats``. ``forced`` (the tests' forced plans) or ``min_share`` 0: planned, at the block size the
    cycle model prices best."""
    share = regime.min_share
    if forced:
        regime.min_share = 0.0
    try:
        chosen, decision = admitted(regime, config, sizes, n_prompt, rows, fits)
    finally:
        regime.min_share = share
    mode = decision.mode
    stats.count_admission(mode, chosen.block_size if mode != "ar" else None, bool(sizes))
    return chosen

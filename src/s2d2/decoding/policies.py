"""Routing policies: when is a verification forward worth its cost? (docs/METHOD.md section 4)

A policy is one class with ``decide(features) -> bool`` and, for learning policies, ``update``. Add a
policy by writing a class and registering it in :data:`POLICIES` under the name the CLI uses.
Policies are created per generation, so their state (hysteresis, bandit statistics) is per row, except
UCB with ``ucb_scope="engine"``, whose statistics the engine's requests share (:mod:`.routing_state`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from ..config import DecodeConfig
from . import functional as F
from .routing_state import EngineRoutingState


@dataclass
class RouteFeatures:
    """What a policy may look at for one step; expensive values are computed only when asked for."""

    #: drafter distributions ``[s, V]`` and drafted tokens ``[s]`` over the span
    span_probs: torch.Tensor
    span_drafts: torch.Tensor
    block_size: int
    #: committed positions of the block / block size, before this step
    progress: float
    #: masked positions in the block whose confidence exceeds tau (what the dynamic rule would commit)
    n_dynamic: int
    config: DecodeConfig

    @property
    def span_len(self) -> int:
        return int(self.span_drafts.numel())

    @cached_property
    def alpha(self) -> torch.Tensor:
        c = self.config
        return F.acceptance_estimate(c.estimator, self.span_probs, self.span_drafts, c.estimator_value)

    @cached_property
    def expected_len(self) -> float:
        return F.expected_accept_length(self.alpha)

    @cached_property
    def score(self) -> float:
        c = self.config
        return F.verify_score(self.expected_len, kind=c.score, penalty=c.penalty, n_dynamic=self.n_dynamic)

    @cached_property
    def mean_entropy(self) -> float:
        return float(F.normalized_entropy(self.span_probs).mean())


class Policy:
    """Base class: decide whether to verify this step."""

    name = "base"

    def __init__(self, config: DecodeConfig):
        self.config = config

    def decide(self, f: RouteFeatures) -> bool:
        raise NotImplementedError

    def update(self, f: RouteFeatures, verified: bool, committed: int) -> None:
        """Feedback after the step (tokens committed, whether it verified). Most policies ignore it."""


class Never(Policy):
    name = "never"

    def decide(self, f: RouteFeatures) -> bool:
        return False


class Always(Policy):
    name = "always"

    def decide(self, f: RouteFeatures) -> bool:
        return True


class MinSpan(Policy):
    """Verify when the span has at least ``min_span`` positions."""

    name = "min-span"

    def decide(self, f: RouteFeatures) -> bool:
        return f.span_len >= self.config.min_span


class ScoreThreshold(Policy):
    """Verify when s = E[K] - penalty >= ``score_threshold``."""

    name = "score"

    def decide(self, f: RouteFeatures) -> bool:
        return f.score >= self.config.score_threshold


class Hysteresis(Policy):
    """Off -> on when s > ``hysteresis_on``; stays on while s >= ``hysteresis_off``. Starts off."""

    name = "hysteresis"

    def __init__(self, config: DecodeConfig):
        super().__init__(config)
        self.on = False

    def decide(self, f: RouteFeatures) -> bool:
        s = f.score
        self.on = s >= self.config.hysteresis_off if self.on else s > self.config.hysteresis_on
        return self.on


@dataclass
class _Arm:
    pulls: int = 0
    total: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else 0.0


class UCB(Policy):
    """Contextual bandit with two arms (verify, skip) per context bucket.

    Context = (span length bin over [1, B], block progress bin over [0, 1], mean normalised span
    entropy bin over [0, 1]), ``ucb_bins`` bins each. Picks the arm with the larger
    mean + beta * sqrt(ln t / n), an untried arm first (verify before skip); reward = tokens committed
    this step / cost, cost 2 if verified else 1.
    """

    name = "ucb"
    ARMS = (True, False)  # verify, skip

    def __init__(
        self, config: DecodeConfig, stats: dict[tuple[int, int, int], dict[bool, _Arm]] | None = None
    ):
        super().__init__(config)
        #: context -> arm -> statistics; a shared table (``ucb_scope="engine"``) when one is given
        self.stats: dict[tuple[int, int, int], dict[bool, _Arm]] = {} if stats is None else stats

    def context(self, f: RouteFeatures) -> tuple[int, int, int]:
        k = self.config.ucb_bins
        return (
            F.bin_index(f.span_len, 1, f.block_size, k),
            F.bin_index(f.progress, 0.0, 1.0, k),
            F.bin_index(f.mean_entropy, 0.0, 1.0, k),
        )

    def bonus(self, t: int, n: int) -> float:
        return self.config.ucb_beta * math.sqrt(math.log(max(t, 1)) / n)

    def decide(self, f: RouteFeatures) -> bool:
        arms = self.stats.setdefault(self.context(f), {a: _Arm() for a in self.ARMS})
        for a in self.ARMS:
            if arms[a].pulls == 0:
                return a
        t = sum(arm.pulls for arm in arms.values())
        values = {a: arms[a].mean + self.bonus(t, arms[a].pulls) for a in self.ARMS}
        return max(self.ARMS, key=lambda a: values[a])

    def update(self, f: RouteFeatures, verified: bool, committed: int) -> None:
        arm = self.stats.setdefault(self.context(f), {a: _Arm() for a in self.ARMS})[verified]
        arm.pulls += 1
        arm.total += committed / (2.0 if verified else 1.0)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Never, Always, MinSpan, ScoreThreshold, Hysteresis, UCB)
}


def make_policy(config: DecodeConfig, shared: EngineRoutingState | None = None) -> Policy:
    """The routing policy of one request. With ``ucb_scope="engine"`` and the engine's ``shared`` state, a
    UCB policy learns in the table it shares with the engine's other requests of the same settings
    (:mod:`.routing_state`); without ``shared`` it falls back to its own statistics."""
    if config.policy == UCB.name and config.ucb_scope == "engine" and shared is not None:
        return UCB(config, stats=shared.table(config))
    return POLICIES[config.policy](config)


__all__ = ["POLICIES", "EngineRoutingState", "Policy", "RouteFeatures", "make_policy"]

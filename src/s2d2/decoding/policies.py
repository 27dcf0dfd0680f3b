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

from ..config import POLICY_NAMES, DecodeConfig
from . import functional as F
from .routing_state import ArmStats, EngineRoutingState, Table
from .syntax_view import SpanSource, SyntaxView


@dataclass
class RouteFeatures:
    """What a policy may look at for one step, as host values (the step computed them on the device).

    ``alpha`` holds the estimator's per-position acceptance estimates over the span and
    ``norm_entropy`` the drafter's normalised entropy there (each None when the policy needs none).
    Reductions run on host float32 tensors, exactly as on the drafter's own values.
    """

    span_len: int
    alpha: list[float] | None
    norm_entropy: list[float] | None
    block_size: int
    #: committed positions of the block / block size, before this step
    progress: float
    #: masked positions in the block whose confidence exceeds tau (what the dynamic rule would commit)
    n_dynamic: int
    config: DecodeConfig
    #: the span's token ids in its row, and the request's static checks (both None unless the policy
    #: checks syntax: :attr:`Policy.syntax`)
    source: SpanSource | None = None
    syntax: SyntaxView | None = None

    @cached_property
    def syntax_dead(self) -> bool:
        """Whether the static checks find that no continuation can make the program valid once the span
        is committed (False without checks)."""
        return self.syntax is not None and self.source is not None and self.syntax.dead(self.source)

    @cached_property
    def weak_keys(self) -> list[int]:
        """Span positions at key positions (:mod:`s2d2.codecheck.keys`) whose acceptance estimate is
        below ``key_confidence`` (empty without checks or estimates)."""
        if self.syntax is None or self.source is None or self.alpha is None:
            return []
        keys = self.syntax.key_positions(self.source)
        return [i for i in keys if i < len(self.alpha) and self.alpha[i] < self.config.key_confidence]

    @cached_property
    def expected_len(self) -> float:
        """E[K] = sum_k prod_{i<=k} alpha_i."""
        return F.expected_accept_length(torch.tensor(self.alpha, dtype=torch.float32))

    @cached_property
    def score(self) -> float:
        c = self.config
        return F.verify_score(self.expected_len, kind=c.score, penalty=c.penalty, n_dynamic=self.n_dynamic)

    @cached_property
    def mean_entropy(self) -> float:
        return float(torch.tensor(self.norm_entropy, dtype=torch.float32).mean())


@dataclass(frozen=True)
class SkipCheck:
    """What a verified step tells about skipping it: the fallback rule would have committed ``commits``
    tokens, ``unvouched`` of them outside the span prefix the verification accepted (the first rejected
    position, positions past it, or positions outside the span: tokens AR mode did not confirm)."""

    commits: int
    unvouched: int

    @classmethod
    def of(cls, fallback: list[int], span_off: int, n_accepted: int) -> SkipCheck:
        """From the fallback rule's picks (indices into the step's candidates), the span's offset among
        the candidates and the number of span positions the verification accepted."""
        vouched = sum(1 for i in fallback if span_off <= i < span_off + n_accepted)
        return cls(len(fallback), len(fallback) - vouched)


class Policy:
    """Base class: decide whether to verify this step."""

    name = "base"
    #: which features :meth:`decide` reads: the estimator's alphas (scores) and the span's entropies
    #: (the step computes only what some policy asks for)
    reads_alpha = False
    reads_entropy = False
    #: whether :meth:`update` wants each verified step's :class:`SkipCheck` (computing it costs a little)
    learns_from_checks = False
    #: the decision of a policy that reads no features and learns nothing (None: it decides per step);
    #: the step then builds no :class:`RouteFeatures` unless something else reads them
    fixed: bool | None = None
    #: the request's static checks of its spans (None: the step gives no :attr:`RouteFeatures.source`)
    syntax: SyntaxView | None = None

    def __init__(self, config: DecodeConfig):
        self.config = config

    def decide(self, f: RouteFeatures) -> bool:
        raise NotImplementedError

    def update(
        self, f: RouteFeatures, verified: bool, committed: int, check: SkipCheck | None = None
    ) -> None:
        """Feedback after the step: whether it verified, the tokens it committed and, for a verified step
        when :attr:`learns_from_checks`, what skipping would have committed. Most policies ignore it."""


class Never(Policy):
    name = "never"
    fixed = False

    def decide(self, f: RouteFeatures) -> bool:
        return False


class Always(Policy):
    name = "always"
    fixed = True

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
    reads_alpha = True

    def decide(self, f: RouteFeatures) -> bool:
        return f.score >= self.config.score_threshold


class Hysteresis(Policy):
    """Off -> on when s > ``hysteresis_on``; stays on while s >= ``hysteresis_off``. Starts off."""

    name = "hysteresis"
    reads_alpha = True

    def __init__(self, config: DecodeConfig):
        super().__init__(config)
        self.on = False

    def decide(self, f: RouteFeatures) -> bool:
        s = f.score
        self.on = s >= self.config.hysteresis_off if self.on else s > self.config.hysteresis_on
        return self.on


class UCB(Policy):
    """Contextual bandit with two arms (verify, skip) per context bucket.

    Context = (span length bin over [1, B], block progress bin over [0, 1], mean normalised span
    entropy bin over [0, 1], or of its log10 over [-4, 0] with ``ucb_entropy_scale="log"``),
    ``ucb_bins`` equal-width bins each. A verified step earns committed / 2 (two forwards).

    ``ucb_reward="committed"`` (the paper's): a skipped step earns the tokens it committed; pick the arm
    with the larger mean + beta * sqrt(ln t / n), an untried arm first (verify before skip). Nothing in
    it sees the errors of unverified commits, so skipping wins wherever the fallback commits much.

    ``ucb_reward="checked"`` (``auto`` at engine scope): every verification also shows what skipping
    would have earned there (:class:`SkipCheck`): the fallback's commits minus ``ucb_error_cost`` per
    token the verification did not vouch for, with a prior of one unvouched token. Skipping itself
    reveals nothing about its errors, so the policy verifies unless that estimate beats the verify
    arm's mean by more than both arms' bonus, 2 beta sqrt(ln t / n_verify) (docs/METHOD.md section 9).
    """

    name = "ucb"
    reads_entropy = True
    ARMS = (True, False)  # verify, skip

    def __init__(self, config: DecodeConfig, stats: Table | None = None):
        super().__init__(config)
        #: context -> arm -> statistics; a shared table (``ucb_scope="engine"``) when one is given
        self.stats: Table = {} if stats is None else stats
        self.learns_from_checks = config.ucb_checked

    def context(self, f: RouteFeatures) -> tuple[int, int, int]:
        k = self.config.ucb_bins
        if self.config.ucb_log_entropy:
            entropy = F.bin_index(math.log10(max(f.mean_entropy, 1e-4)), -4.0, 0.0, k)
        else:
            entropy = F.bin_index(f.mean_entropy, 0.0, 1.0, k)
        return (F.bin_index(f.span_len, 1, f.block_size, k), F.bin_index(f.progress, 0.0, 1.0, k), entropy)

    def bonus(self, t: int, n: int) -> float:
        return self.config.ucb_beta * math.sqrt(math.log(max(t, 1)) / n)

    def _arms(self, f: RouteFeatures) -> dict[bool, ArmStats]:
        return self.stats.setdefault(self.context(f), {a: ArmStats() for a in self.ARMS})

    def decide(self, f: RouteFeatures) -> bool:
        arms = self._arms(f)
        t = sum(arm.pulls for arm in arms.values())
        if self.learns_from_checks:
            v = arms[True]
            if v.pulls == 0:
                return True
            # one pseudo-observation of a skip that commits nothing and one unvouched token keeps a
            # context's first error-free checks from licensing skips (it weighs 1 / n once learnt)
            errors = v.skip_unvouched + 1
            skip = (v.skip_commits - self.config.ucb_error_cost * errors) / (v.pulls + 1)
            return skip - v.mean <= 2 * self.bonus(t, v.pulls)
        for a in self.ARMS:
            if arms[a].pulls == 0:
                return a
        values = {a: arms[a].mean + self.bonus(t, arms[a].pulls) for a in self.ARMS}
        return max(self.ARMS, key=lambda a: values[a])

    def update(
        self, f: RouteFeatures, verified: bool, committed: int, check: SkipCheck | None = None
    ) -> None:
        arm = self._arms(f)[verified]
        arm.pulls += 1
        arm.total += committed / (2.0 if verified else 1.0)
        if check is not None:
            arm.skip_commits += check.commits
            arm.skip_unvouched += check.unvouched


class Syntax(ScoreThreshold):
    """Static checks as a routing signal (docs/METHOD.md, "Code"): verify a span after which no
    continuation can make the program valid (:attr:`RouteFeatures.syntax_dead`); with ``key_positions``
    also a span holding a key position whose acceptance estimate is below ``key_confidence``;
    elsewhere the score rule decides (:class:`ScoreThreshold`).

    The checks need the model's tokenizer (``detokenize``; :class:`~.syntax_view.SyntaxView`, language
    ``syntax_language``); without one the policy is the score rule."""

    name = "syntax"

    def __init__(self, config: DecodeConfig, detokenize=None):
        super().__init__(config)
        if detokenize is not None:
            self.syntax = SyntaxView(config.syntax_language, detokenize)

    def decide(self, f: RouteFeatures) -> bool:
        if f.syntax_dead:
            return True
        if self.config.key_positions and f.weak_keys:
            return True
        return super().decide(f)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Never, Always, MinSpan, ScoreThreshold, Hysteresis, UCB, Syntax)
}
# the settings name the policies without importing this module: the two lists must agree
assert tuple(POLICIES) == POLICY_NAMES, (tuple(POLICIES), POLICY_NAMES)


def make_policy(config: DecodeConfig, shared: EngineRoutingState | None = None) -> Policy:
    """The routing policy of one request. With ``ucb_scope="engine"`` and the engine's ``shared`` state, a
    UCB policy learns in the table it shares with the engine's other requests of the same settings
    (:mod:`.routing_state`); without ``shared`` it falls back to its own statistics. A ``syntax`` policy
    checks its spans with the tokenizer the engine's ``shared`` state holds (``detokenize``), if any."""
    if config.policy == UCB.name and config.ucb_scope == "engine" and shared is not None:
        return UCB(config, stats=shared.table(config))
    if config.policy == Syntax.name:
        return Syntax(config, shared.detokenize if shared is not None else None)
    return POLICIES[config.policy](config)


__all__ = ["POLICIES", "EngineRoutingState", "Policy", "RouteFeatures", "SkipCheck", "make_policy"]

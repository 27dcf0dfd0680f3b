"""The search space of ``s2d2 tune``: S2D2 settings an Optuna trial samples.

Searched: block size, causal cache, routing policy and its parameters (score threshold, hysteresis
thresholds, minimum span, UCB beta / bins / reward / entropy scale), acceptance estimator and its
parameter, score kind and penalty, fallback rule and its threshold (tau or gamma), acceptance rule (and
tempering), plus the fusion settings of the families that have them (Fast-dLLM v2 sub-blocks, LLaDA2.1
token editing). Parameters only exist where they matter (Optuna's conditional search space): e.g. the
estimator is sampled only for the score and hysteresis policies, which are the ones that read it.

Never searched, on purpose:

- ``ucb_scope`` stays ``request``: with ``engine`` a request's output depends on the requests the engine
  served before it, so a tuned preset (and a model's shipped default) would break batch == alone.
Fused verification (``fuse``, ``predraft_positions``, ``predraft_tokens``) is searched where it is valid:
always-verify, strict acceptance and a causal cache on a same-position family without token editing
(see ``DecodeConfig.validate``); there its output equals AR greedy's whatever the other settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ESTIMATORS, FALLBACKS, SCORES

BLOCK_SIZES = (4, 8, 16)
POLICIES = ("always", "score", "hysteresis", "min-span", "ucb", "never")
#: Range (low, high) of each estimator's parameter, searched on a log scale.
ESTIMATOR_RANGES: dict[str, tuple[float, float]] = {
    "hard-margin": (0.01, 0.5),
    "hard-entropy": (0.01, 0.5),
    "confidence-power": (0.2, 4.0),
    "clipped-margin": (0.5, 5.0),
    "soft-entropy": (0.2, 8.0),
}


@dataclass(frozen=True)
class SearchSpace:
    """What a trial may choose from. ``family`` adds the family's fusion settings."""

    block_sizes: tuple[int, ...] = BLOCK_SIZES
    policies: tuple[str, ...] = POLICIES
    family: str = "sdar"

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Sample one configuration: decoding settings under ``DecodeConfig``'s names."""
        b = trial.suggest_categorical("block_size", list(self.block_sizes))
        s: dict[str, Any] = {"decoder": "s2d2", "block_size": b}
        s["causal_cache"] = trial.suggest_categorical("causal_cache", [False, True])
        s.update(_routing(trial, trial.suggest_categorical("policy", list(self.policies)), b))
        s.update(_fallback(trial, needs_tau=s.get("score") == "dynamic"))
        s["acceptance"] = trial.suggest_categorical("acceptance", ["strict", "probabilistic"])
        if s["acceptance"] == "probabilistic":
            s["tempering"] = trial.suggest_float("tempering", 0.5, 2.0)
        s.update(self._fusion(trial, b))
        s.update(self._fused_verification(trial, s))
        return s

    def _fused_verification(self, trial: Any, s: dict[str, Any]) -> dict[str, Any]:
        eligible = (
            s["policy"] == "always"
            and s["acceptance"] == "strict"
            and s["causal_cache"]
            and self.family != "fast_dllm_v2"
            and "editing_threshold" not in s
        )
        if not eligible or not trial.suggest_categorical("fuse", [False, True]):
            return {}
        return {
            "fuse": True,
            "predraft_positions": trial.suggest_int("predraft_positions", 1, 6),
            "predraft_tokens": trial.suggest_int("predraft_tokens", 0, 1),
        }

    def _fusion(self, trial: Any, b: int) -> dict[str, Any]:
        if self.family == "fast_dllm_v2":
            # one fixed choice list (Optuna's categorical space may not change from trial to trial),
            # clamped to the block: a sub-block larger than the block, or not dividing it, is the block
            u = min(trial.suggest_categorical("sub_block_size", [4, 8, 16, 32]), b)
            return {"sub_block_size": u if b % u == 0 else b}
        if self.family == "llada2" and trial.suggest_categorical("editing", [False, True]):
            return {"editing_threshold": trial.suggest_float("editing_threshold", 0.5, 0.99)}
        return {}


def _routing(trial: Any, policy: str, b: int) -> dict[str, Any]:
    s: dict[str, Any] = {"policy": policy}
    if policy in ("score", "hysteresis"):
        est = trial.suggest_categorical("estimator", list(ESTIMATORS))
        s["estimator"] = est
        if est in ESTIMATOR_RANGES:
            lo, hi = ESTIMATOR_RANGES[est]
            s["estimator_param"] = trial.suggest_float(f"estimator_param.{est}", lo, hi, log=True)
        s["score"] = trial.suggest_categorical("score", list(SCORES))
        s["penalty"] = trial.suggest_float("penalty", 0.0, 4.0)
        if policy == "score":
            s["score_threshold"] = trial.suggest_float("score_threshold", -4.0, 3.0)
        else:
            s["hysteresis_on"] = trial.suggest_float("hysteresis_on", 0.0, 4.0)
            s["hysteresis_off"] = trial.suggest_float("hysteresis_off", -6.0, -0.5)
    elif policy == "min-span":
        s["min_span"] = trial.suggest_int("min_span", 1, max(BLOCK_SIZES))
        s["min_span"] = min(s["min_span"], b)
    elif policy == "ucb":
        s["ucb_beta"] = trial.suggest_float("ucb_beta", 0.0, 2.0)
        s["ucb_bins"] = trial.suggest_int("ucb_bins", 1, 4)
        s["ucb_reward"] = trial.suggest_categorical("ucb_reward", ["committed", "checked"])
        s["ucb_entropy_scale"] = trial.suggest_categorical("ucb_entropy_scale", ["linear", "log"])
        s["ucb_scope"] = "request"  # never "engine": a preset must keep batch == alone
    return s


def _fallback(trial: Any, *, needs_tau: bool) -> dict[str, Any]:
    fb = trial.suggest_categorical("fallback", list(FALLBACKS))
    s: dict[str, Any] = {"fallback": fb}
    if fb == "dynamic" or needs_tau:
        s["threshold"] = trial.suggest_float("threshold", 0.5, 0.99)
    if fb == "eb":
        s["gamma"] = trial.suggest_float("gamma", 0.01, 1.0, log=True)
    return s


#: Hand-written starting points (the strongest rows of the bench's default grid), tried first in a new
#: study so that the search starts from what is known to work. Missing parameters are sampled.
_SCORE_SEED = dict(policy="score", estimator="soft-entropy", penalty=1.0, score_threshold=0.0)
_SCORE_SEED["estimator_param.soft-entropy"] = 1.0
SEED_POINTS: tuple[dict[str, Any], ...] = (
    dict(block_size=8, causal_cache=False, **_SCORE_SEED, score="dynamic", fallback="dynamic", threshold=0.9,
         acceptance="strict"),
    dict(block_size=8, causal_cache=True, **_SCORE_SEED, score="static", fallback="dynamic", threshold=0.95,
         acceptance="strict"),
    dict(block_size=8, causal_cache=False, policy="always", fallback="dynamic", threshold=0.9,
         acceptance="strict"),
    # the lossless-fused preset at B16 and B8 (AR's output, about one forward per step)
    dict(block_size=16, causal_cache=True, policy="always", fallback="static", acceptance="strict",
         fuse=True, predraft_positions=4, predraft_tokens=0),
    dict(block_size=8, causal_cache=True, policy="always", fallback="static", acceptance="strict",
         fuse=True, predraft_positions=4, predraft_tokens=0),
)  # fmt: skip


__all__ = ["BLOCK_SIZES", "ESTIMATOR_RANGES", "POLICIES", "SEED_POINTS", "SearchSpace"]

"""Bench configurations and the named grids of them (``s2d2 bench --grid``).

A :class:`BenchConfig` is a name and decoding settings under the CLI's names; :data:`GRIDS` maps a grid
name to its configurations, built from the ``_ar`` / ``_static`` / ``_dynamic`` / ``_eb`` / ``_s2d2`` /
``_lossless`` builders (which also fix each configuration's name) and the S2D2 routings of
:data:`S2D2_ROUTINGS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import S2D2Error
from ..setting_ranges import MAX_SCORE

#: The decoder families (the ``decoder`` field of each run).
FAMILIES = ("ar", "static", "dynamic", "eb", "s2d2")


@dataclass(frozen=True)
class BenchConfig:
    """One named configuration: decoding settings under the CLI's names (a ``preset`` is allowed)."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def decoder(self) -> str:
        """The decoder family (``ar``, ``static``, ``dynamic``, ``eb`` or ``s2d2``)."""
        return str(self.expanded().get("decoder", "s2d2"))

    def expanded(self) -> dict[str, Any]:
        """The settings with the preset's values written out (explicit settings win); the preset is a name
        in :data:`s2d2.presets.PRESETS` or a preset file."""
        from ..config import preset_settings
        from ..errors import ConfigError

        out: dict[str, Any] = {}
        if "preset" in self.settings:
            try:
                values = preset_settings(self.settings["preset"])
            except ConfigError as exc:
                raise S2D2Error(f"configuration {self.name}: {exc}") from None
            out["preset"] = self.settings["preset"]
            out.update(values)
        out.update({k: v for k, v in self.settings.items() if k != "preset"})
        return out


def _num(x: float) -> str:
    return f"{x:g}"


def _ar() -> BenchConfig:
    return BenchConfig("ar", {"decoder": "ar"})


def _static(b: int, s: int) -> BenchConfig:
    return BenchConfig(f"static-b{b}-s{s}", {"decoder": "static", "block_size": b, "steps": s})


def _dynamic(b: int, tau: float) -> BenchConfig:
    return BenchConfig(
        f"dynamic-b{b}-t{_num(tau)}", {"decoder": "dynamic", "block_size": b, "threshold": tau}
    )


def _eb(b: int, gamma: float) -> BenchConfig:
    return BenchConfig(f"eb-b{b}-g{_num(gamma)}", {"decoder": "eb", "block_size": b, "gamma": gamma})


def _syntax(score_threshold: float, keys: bool) -> dict[str, Any]:
    """The ``syntax`` policy over score-static at ``score_threshold``, with key positions or not."""
    return {
        "policy": "syntax",
        "score": "static",
        "penalty": 1.0,
        "score_threshold": score_threshold,
        "key_positions": keys,
    }


#: S2D2 routings: short name -> policy settings (docs/METHOD.md section 4 and the paper's settings).
S2D2_ROUTINGS: dict[str, Callable[[int], dict[str, Any]]] = {
    "always": lambda b: {"policy": "always"},
    "score-static": lambda b: {"policy": "score", "score": "static", "penalty": 1.0, "score_threshold": 0.0},
    "score-dynamic": lambda b: {
        "policy": "score",
        "score": "dynamic",
        "penalty": 1.0,
        "score_threshold": 0.0,
    },
    "hysteresis": lambda b: {
        "policy": "hysteresis",
        "score": "dynamic",
        "penalty": 1.0,
        "hysteresis_on": 1.0,
        "hysteresis_off": -5.0,
    },
    "min-span": lambda b: {"policy": "min-span", "min_span": max(2, b // 4)},
    "ucb": lambda b: {"policy": "ucb", "ucb_beta": 1.0, "ucb_bins": 2},
    # static checks on code: with score-static elsewhere, or alone (score_threshold out of reach), each
    # without and with key positions
    "syntax": lambda b: _syntax(0.0, False),
    "syntax-keys": lambda b: _syntax(0.0, True),
    "syntax-only": lambda b: _syntax(MAX_SCORE, False),
    "syntax-keys-only": lambda b: _syntax(MAX_SCORE, True),
}
#: Routings only code grids run (a math suite has no program to check).
CODE_ROUTINGS = ("syntax", "syntax-keys", "syntax-only", "syntax-keys-only")


def _s2d2(
    b: int, routing: str, acceptance: str, *, fallback_tau: float = 0.9, causal_cache: bool = False
) -> BenchConfig:
    acc = "strict" if acceptance == "strict" else "prob"
    name = f"s2d2-b{b}-{routing}-{acc}"
    settings: dict[str, Any] = {
        "decoder": "s2d2",
        "block_size": b,
        **S2D2_ROUTINGS[routing](b),
        "acceptance": acceptance,
        "fallback": "dynamic",
        "threshold": fallback_tau,
    }
    if fallback_tau != 0.9:
        name += f"-fb{_num(fallback_tau)}"
    if causal_cache:
        settings["causal_cache"] = True
        name += "-cc"
    return BenchConfig(name, settings)


def _lossless(b: int) -> BenchConfig:
    return BenchConfig(f"lossless-b{b}", {"preset": "lossless", "block_size": b})


def _lossless_fused(b: int) -> BenchConfig:
    return BenchConfig(f"lossless-fused-b{b}", {"preset": "lossless-fused", "block_size": b})


def _lossless_auto(b: int = 8) -> BenchConfig:
    """The step planner over fused lossless decoding (``plan=auto``): ``lossless-auto`` is the preset at
    B8, whose block size the engine may raise to 16 by load (``plan_block_sizes``); ``lossless-auto-b4``
    and ``-b16`` keep their block size."""
    if b == 8:
        return BenchConfig("lossless-auto", {"preset": "lossless-auto", "block_size": b})
    fixed = {"preset": "lossless-auto", "block_size": b, "plan_block_sizes": ()}
    return BenchConfig(f"lossless-auto-b{b}", fixed)


def _default_grid() -> list[BenchConfig]:
    blocks = (4, 8, 16)
    grid = [_ar()]
    grid += [_static(b, s) for b in blocks for s in sorted({b, b // 2, b // 4}, reverse=True)]
    grid += [_dynamic(b, tau) for b in blocks for tau in (0.5, 0.7, 0.9, 0.95, 0.99)]
    grid += [_eb(b, g) for b in (8, 16) for g in (0.01, 0.1, 0.5)]
    for b in blocks:
        for routing in S2D2_ROUTINGS:
            if routing not in CODE_ROUTINGS:
                grid += [_s2d2(b, routing, acc) for acc in ("strict", "probabilistic")]
        grid += [_lossless(b), _lossless_fused(b)]
    grid += [_lossless_auto(b) for b in (8, 4, 16)]
    # cheap S2D2 points: dynamic-score routing with a low fallback threshold (to face dynamic tau .5/.7)
    grid += [_s2d2(b, "score-dynamic", "strict", fallback_tau=tau) for b in blocks for tau in (0.5, 0.7)]
    # routing that skips verification falls back to the threshold rule: a stricter fallback + causal cache
    grid += [
        _s2d2(b, "score-static", "strict", fallback_tau=tau, causal_cache=True)
        for b in (8, 16)
        for tau in (0.95, 0.99)
    ]
    return grid


def _paper_grid() -> list[BenchConfig]:
    return [
        _ar(),
        _dynamic(4, 0.85),
        _dynamic(16, 0.85),
        BenchConfig("paper-sdar-a", {"preset": "paper-sdar-a"}),
        BenchConfig("paper-sdar-b", {"preset": "paper-sdar-b"}),
    ]


def _quick_grid() -> list[BenchConfig]:
    return [
        _ar(),
        _dynamic(8, 0.9),
        _s2d2(8, "always", "strict"),
        _s2d2(8, "score-static", "strict"),
        _lossless(8),
    ]


def _headline_grid() -> list[BenchConfig]:
    """The rows of BENCHMARKS.md's headline table (all in the default grid)."""
    return [
        _ar(),
        _dynamic(8, 0.9),
        _s2d2(8, "always", "strict"),
        _s2d2(8, "score-dynamic", "strict"),
        _s2d2(16, "score-static", "strict", fallback_tau=0.95, causal_cache=True),
        _lossless(8),
        _lossless_fused(8),
        _lossless(16),
        _lossless_fused(16),
    ]


def _ucb_grid() -> list[BenchConfig]:
    """UCB routing by scope and reward at B8 and B16, beside always-verify (BENCHMARKS.md, METHOD 9)."""
    grid = [_ar()]
    for b in (8, 16):
        always, ucb = _s2d2(b, "always", "strict"), _s2d2(b, "ucb", "strict")
        engine = {**ucb.settings, "ucb_scope": "engine"}
        grid += [
            always,
            ucb,
            BenchConfig(f"s2d2-b{b}-ucb-engine-strict", engine),
            BenchConfig(f"s2d2-b{b}-ucb-engine-committed-strict", {**engine, "ucb_reward": "committed"}),
        ]
    return grid


def _code_grid() -> list[BenchConfig]:
    """The rows of BENCHMARKS.md's "Code" tables: AR, dynamic at three thresholds, score routing, the
    static checks over it and alone, without and with key positions (same block size and score rule),
    lossless; then B16 with low fallback thresholds."""
    grid = [_ar()] + [_dynamic(8, tau) for tau in (0.7, 0.9, 0.99)]
    routings = ("score-static", "syntax", "syntax-keys", "syntax-only", "syntax-keys-only")
    grid += [_s2d2(8, routing, "strict") for routing in routings]
    grid += [_lossless(8), _lossless_auto(8)]
    # a weaker drafter: B16 with low fallback thresholds, where unverified commits break programs
    for tau in (0.5, 0.3):
        grid += [_dynamic(16, tau)]
        grid += [_s2d2(16, routing, "strict", fallback_tau=tau) for routing in routings]
    return grid


#: Named grids of configurations.
GRIDS: dict[str, list[BenchConfig]] = {
    "default": _default_grid(),
    "headline": _headline_grid(),
    "paper": _paper_grid(),
    "quick": _quick_grid(),
    "ucb": _ucb_grid(),
    "code": _code_grid(),
}


def get_grid(name: str) -> list[BenchConfig]:
    if name not in GRIDS:
        raise S2D2Error(f"unknown grid {name!r}; choose one of: {', '.join(GRIDS)}")
    return list(GRIDS[name])

"""The range of every numeric decoding setting, checked whatever the decoder, policy or family.

:meth:`s2d2.config.DecodeConfig.validate` applies :func:`check_ranges` after its own checks, so a value no
setting could use sensibly (``ucb_beta=1.8e19``, ``post_steps=100000``) is a one-line ``ConfigError``
even where the active policy or family never reads it: a setting is either honoured or refused, never
accepted and dropped. The bounds are generous (every shipped preset, the defaults and ``s2d2 tune``'s
search space lie well inside them); they exist to refuse what cannot be meant, NaN and infinities
included.

Each entry: ``(low, high, low_open)``; ``low_open`` excludes ``low`` itself (``gamma > 0``). Settings
whose range depends on another setting (``steps`` and ``sub_block_size`` on ``block_size``) or on the
model (token ids, the context) are checked where that is known (``DecodeConfig.validate``, the engine,
the server).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: Most positions of a block (and of a span, a pre-draft count): far beyond any model's useful block.
MAX_POSITIONS = 1 << 16
#: Most tokens a request may ask to generate.
MAX_NEW_TOKENS = 1 << 20
#: Most edit-only passes after a block's masks are gone (each is a forward).
MAX_POST_STEPS = 256
#: Most contexts the UCB policy bins entropy into (each bin is a table row).
MAX_UCB_BINS = 256
#: Bound of the real-valued score and cost settings (scores are tokens per forward: a block's worth).
MAX_SCORE = 1e6
#: Sampling temperatures outside this range overflow the softmax in float32.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
#: Most alternatives ``logprobs`` may ask for per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20
#: The seed's range: any signed or unsigned 64-bit integer.
SEED_RANGE = (-(2**63), 2**64 - 1)

#: setting -> (low, high) for the integer settings (both included).
INT_RANGES: dict[str, tuple[int, int]] = {
    "block_size": (1, MAX_POSITIONS),
    "min_span": (1, MAX_POSITIONS),
    "ucb_bins": (1, MAX_UCB_BINS),
    "max_new_tokens": (1, MAX_NEW_TOKENS),
    "min_tokens": (0, MAX_NEW_TOKENS),
    "post_steps": (0, MAX_POST_STEPS),
    "predraft_positions": (0, MAX_POSITIONS),
    "predraft_tokens": (0, MAX_POSITIONS),
    "top_k": (0, 1 << 24),
}
#: setting -> (low, high, low_open) for the real-valued settings.
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "gamma": (0.0, MAX_SCORE, True),
    "penalty": (0.0, MAX_SCORE, False),
    "score_threshold": (-MAX_SCORE, MAX_SCORE, False),
    "hysteresis_on": (-MAX_SCORE, MAX_SCORE, False),
    "hysteresis_off": (-MAX_SCORE, MAX_SCORE, False),
    "ucb_beta": (0.0, 100.0, False),
    "ucb_error_cost": (0.0, MAX_SCORE, False),
    "tempering": (0.0, 100.0, True),
    "key_confidence": (0.0, 1.0, False),
}
#: Optional (None allowed) real-valued settings.
OPTIONAL_FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "estimator_param": (0.0, MAX_SCORE, False),
}


def _interval(low: float, high: float, low_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}]"


def _check_float(
    name: str, value: Any, bounds: tuple[float, float, bool], fail: Callable[[str], None]
) -> None:
    low, high, low_open = bounds
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    inside = number and math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not inside:
        fail(f"{name} must be a number in {_interval(low, high, low_open)}, got {value!r}")


def check_ranges(config: Any, fail: Callable[[str], None]) -> None:
    """Call ``fail`` with a one-line message for the first setting of ``config`` (a ``DecodeConfig``)
    outside its range (see the module docstring)."""
    for name, (low, high) in INT_RANGES.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            fail(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    for name, bounds in FLOAT_RANGES.items():
        _check_float(name, getattr(config, name), bounds, fail)
    for name, bounds in OPTIONAL_FLOAT_RANGES.items():
        if getattr(config, name) is not None:
            _check_float(name, getattr(config, name), bounds, fail)
    seed = config.seed
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]
    ):
        fail(f"seed must be an integer in [-2**63, 2**64 - 1] or unset, got {seed!r}")
    for b in config.plan_block_sizes:
        if b > MAX_POSITIONS:
            fail(f"plan_block_sizes must be at most {MAX_POSITIONS} each, got {b}")


__all__ = ["FLOAT_RANGES", "INT_RANGES", "OPTIONAL_FLOAT_RANGES", "check_ranges"]

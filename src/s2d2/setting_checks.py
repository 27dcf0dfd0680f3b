r"""Checking a :class:`~s2d2.config.DecodeConfig`: every setting's value, and the contradictions between
settings, as one-line :class:`~s2d2.errors.ConfigError`\ s. The categorical settings' options are
:data:`s2d2.config.CHOICES` (passed in, so the settings' module stays the one place naming them); the
numeric ranges that hold whatever the decoder are :mod:`.setting_ranges`."""

from __future__ import annotations

import math
from typing import Any

from .codecheck import CHECKERS
from .errors import ConfigError
from .setting_ranges import MAX_TEMPERATURE, MAX_TOP_LOGPROBS, MIN_TEMPERATURE, check_ranges


def _fail(msg: str) -> None:
    raise ConfigError(msg)


def check_settings(cfg: Any, choices: dict[str, tuple[str, ...]]) -> None:
    """Raise a one-line :class:`ConfigError` for the first invalid or contradictory setting of ``cfg`` (a
    :class:`~s2d2.config.DecodeConfig`); ``choices``: each categorical setting's options."""
    for name, options in choices.items():
        value = getattr(cfg, name)
        if value not in options:
            _fail(f"invalid {name} {value!r}; choose one of: {', '.join(options)}")
    _check_blocks(cfg)
    _check_routing(cfg)
    _check_sampling(cfg)
    _check_lengths(cfg)
    _check_adjust(cfg, _fail)
    if cfg.logprobs is not None and (
        not isinstance(cfg.logprobs, int) or not 0 <= cfg.logprobs <= MAX_TOP_LOGPROBS
    ):
        _fail(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or unset, got {cfg.logprobs!r}")
    if cfg.decoder == "ar" and cfg.block_size != 1:
        _fail("the ar decoder uses block_size 1")
    _check_fusion(cfg, _fail)
    check_ranges(cfg, _fail)  # every setting's range, whatever the decoder, policy or family


def _check_blocks(cfg: Any) -> None:
    """Block size, the planner's block sizes, steps, sub-blocks."""
    if not isinstance(cfg.block_size, int) or cfg.block_size < 1:
        _fail(f"block_size must be an integer >= 1, got {cfg.block_size!r}")
    sizes = cfg.plan_block_sizes
    if not isinstance(sizes, (list, tuple)) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes
    ):
        shown = list(sizes) if isinstance(sizes, tuple) else sizes  # as the user wrote it (JSON, Python)
        _fail(f"plan_block_sizes must be a list of integers >= 1, got {shown!r}")
    if cfg.steps is not None:
        if not isinstance(cfg.steps, int) or cfg.steps < 1:
            _fail(f"steps must be an integer >= 1, got {cfg.steps!r}")
        if cfg.steps > cfg.block_size:
            _fail(f"steps ({cfg.steps}) cannot exceed block_size ({cfg.block_size})")
    if cfg.sub_block_size is not None and not (1 <= cfg.sub_block_size <= cfg.block_size):
        _fail(f"sub_block_size must be in [1, block_size={cfg.block_size}], got {cfg.sub_block_size}")


def _check_routing(cfg: Any) -> None:
    """The baseline rule's threshold and the routing policies' parameters."""
    if not (0.0 < cfg.threshold <= 1.0) or math.isnan(cfg.threshold):
        _fail(f"threshold (tau) must be in (0, 1], got {cfg.threshold}")
    if not cfg.gamma > 0:
        _fail(f"gamma must be > 0, got {cfg.gamma}")
    if cfg.hysteresis_on <= cfg.hysteresis_off:
        on, off = cfg.hysteresis_on, cfg.hysteresis_off
        _fail(f"hysteresis_on ({on}) must be greater than hysteresis_off ({off})")
    if cfg.min_span < 1:
        _fail(f"min_span must be >= 1, got {cfg.min_span}")
    if cfg.penalty < 0:
        _fail(f"penalty must be >= 0, got {cfg.penalty}")
    if cfg.ucb_beta < 0:
        _fail(f"ucb_beta must be >= 0, got {cfg.ucb_beta}")
    if not cfg.ucb_error_cost >= 0:
        _fail(f"ucb_error_cost must be >= 0, got {cfg.ucb_error_cost}")
    if cfg.ucb_bins < 1:
        _fail(f"ucb_bins must be >= 1, got {cfg.ucb_bins}")
    if not cfg.tempering > 0:
        _fail(f"tempering must be > 0, got {cfg.tempering}")
    if cfg.syntax_language not in CHECKERS:
        _fail(f"syntax_language must be one of {', '.join(sorted(CHECKERS))}, got {cfg.syntax_language!r}")
    if cfg.estimator_param is not None and cfg.estimator == "renyi2":
        _fail("the renyi2 estimator takes no parameter")


def _check_sampling(cfg: Any) -> None:
    """Temperature, top-k and top-p."""
    if cfg.temperature < 0 or math.isnan(cfg.temperature):
        _fail(f"temperature must be >= 0, got {cfg.temperature}")
    if 0 < cfg.temperature < MIN_TEMPERATURE or cfg.temperature > MAX_TEMPERATURE:
        _fail(
            f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got "
            f"{cfg.temperature} (outside it the sampling distribution is not finite)"
        )
    if not isinstance(cfg.top_k, int) or cfg.top_k < 0:
        _fail(f"top_k must be an integer >= 0 (0 = off), got {cfg.top_k!r}")
    if not (0.0 < cfg.top_p <= 1.0):
        _fail(f"top_p must be in (0, 1], got {cfg.top_p}")
    if not (0.0 <= cfg.min_p <= 1.0):
        _fail(f"min_p must be in [0, 1], got {cfg.min_p}")


def _check_lengths(cfg: Any) -> None:
    """The output length and LLaDA2.1 editing."""
    if not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        _fail(f"max_new_tokens must be an integer >= 1, got {cfg.max_new_tokens!r}")
    if cfg.editing_threshold is not None and not (0.0 < cfg.editing_threshold <= 1.0):
        _fail(f"editing_threshold must be in (0, 1], got {cfg.editing_threshold}")
    if cfg.post_steps < 0:
        _fail(f"post_steps must be >= 0, got {cfg.post_steps}")


def _check_adjust(cfg: Any, fail: Any) -> None:
    """OpenAI's ranges for logit_bias, the penalties and min_tokens."""
    if not isinstance(cfg.min_tokens, int) or isinstance(cfg.min_tokens, bool) or cfg.min_tokens < 0:
        fail(f"min_tokens must be an integer >= 0, got {cfg.min_tokens!r}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
            fail(f"{name} must be a number in [-2, 2], got {value!r}")
    rep = cfg.repetition_penalty
    if isinstance(rep, bool) or not isinstance(rep, (int, float)) or not 0.0 < rep <= 2.0:
        fail(f"repetition_penalty must be a number in (0, 2] (1 = off), got {rep!r}")
    if not isinstance(cfg.logit_bias, dict):
        fail(f"logit_bias must map token ids to numbers, got {cfg.logit_bias!r}")
    for tok, bias in cfg.logit_bias.items():
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            fail(f"logit_bias keys must be token ids (integers >= 0), got {tok!r}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100.0 <= bias <= 100.0:
            fail(f"logit_bias[{tok}] must be a number in [-100, 100], got {bias!r}")


def _check_fusion(cfg: Any, fail: Any) -> None:
    """Fused verification is built for strict, always-verify, one-token-quota decoding with a causal
    cache (the lossless family): there every step verifies and nothing is committed unverified."""
    if not isinstance(cfg.predraft_positions, int) or cfg.predraft_positions < 0:
        fail(f"predraft_positions must be an integer >= 0, got {cfg.predraft_positions!r}")
    if not isinstance(cfg.predraft_tokens, int) or cfg.predraft_tokens < 0:
        fail(f"predraft_tokens must be an integer >= 0, got {cfg.predraft_tokens!r}")
    missing = cfg.fusion_blockers() if cfg.fuse else []
    if missing:
        fail(f"fuse needs {', '.join(missing)} (as in the lossless preset)")

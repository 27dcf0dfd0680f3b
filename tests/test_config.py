"""Presets carry the paper's configurations (ALGORITHM.md section 5); explicit settings override them."""

from __future__ import annotations

import pytest

import s2d2
from s2d2 import PRESETS, DecodeConfig


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        (
            "paper-sdar-a",
            dict(
                block_size=4,
                num_steps=4,
                policy="score",
                score="static",
                penalty=1.0,
                score_threshold=0.0,
                estimator="soft-entropy",
                threshold=0.85,
                causal_cache=True,
            ),
        ),
        (
            "paper-sdar-b",
            dict(block_size=16, num_steps=16, policy="always", threshold=0.85, causal_cache=True),
        ),
        (
            "paper-fast-dllm-v2-sub4",
            dict(
                block_size=32,
                sub_block_size=4,
                policy="hysteresis",
                score="dynamic",
                penalty=1.0,
                hysteresis_on=1.0,
                hysteresis_off=-5.0,
                threshold=0.9,
            ),
        ),
        (
            "paper-fast-dllm-v2-sub16",
            dict(block_size=32, sub_block_size=16, policy="hysteresis", threshold=0.9),
        ),
        ("paper-fast-dllm-v2-sub32", dict(block_size=32, sub_block_size=32, policy="min-span", min_span=8)),
        (
            "paper-llada2-conservative",
            dict(
                block_size=32,
                threshold=0.95,
                editing_threshold=0.9,
                policy="score",
                score="static",
                penalty=4.0,
                score_threshold=-5.0,
            ),
        ),
        (
            "paper-llada2-quality",
            dict(
                block_size=32,
                threshold=0.7,
                editing_threshold=0.5,
                policy="score",
                score="static",
                penalty=4.0,
                score_threshold=0.0,
            ),
        ),
        (
            "lossless",
            dict(policy="always", strict=True, causal_cache=True, fallback="static", temperature=0.0),
        ),
    ],
)
def test_preset_values(preset, expected):
    cfg = DecodeConfig.build(preset=preset)
    assert cfg.decoder == "s2d2"
    for key, value in expected.items():
        assert getattr(cfg, key) == value, key


def test_lossless_any_block_size_with_quota_one():
    for b in (2, 8, 16):
        cfg = DecodeConfig.build(preset="lossless", block_size=b)
        assert cfg.num_steps == b and all(cfg.quota(s) == 1 for s in range(b))


def test_explicit_settings_override_presets():
    cfg = DecodeConfig.build(preset="paper-sdar-b", block_size=8, steps=8, threshold=0.95)
    assert (cfg.block_size, cfg.num_steps, cfg.threshold, cfg.policy) == (8, 8, 0.95, "always")
    assert set(PRESETS) >= {"paper-sdar-a", "paper-sdar-b", "lossless"}


def test_paper_presets_decode_the_last_block_whole():
    for name in PRESETS:
        expected = "full" if name.startswith("paper-") else "truncate"
        assert DecodeConfig.build(preset=name).last_block == expected, name
    assert DecodeConfig.build(preset="paper-sdar-a", last_block="truncate").last_block == "truncate"
    with pytest.raises(s2d2.ConfigError, match="last_block"):
        DecodeConfig.build(last_block="half")


@pytest.mark.parametrize("temperature", [4e-70, 1e-4, 101.0, 1e81, float("inf")])
def test_temperatures_that_overflow_are_refused(temperature):
    with pytest.raises(s2d2.ConfigError, match="temperature"):
        DecodeConfig.build(temperature=temperature)
    assert DecodeConfig.build(temperature=0.001).temperature == 0.001

"""The lossless family samples exactly at temperature > 0: its presets (and the shipped tiny-gsm preset)
use ``acceptance="auto"``, and fusion inherited from a preset gives way to the unfused path there."""

from __future__ import annotations

import pytest

import s2d2
from s2d2.config import PRESETS, DecodeConfig
from s2d2.errors import ConfigError


@pytest.mark.parametrize("name", ["lossless", "lossless-fused"])
def test_lossless_presets_are_strict_at_temperature_0_and_sample_otherwise(name):
    assert PRESETS[name]["acceptance"] == "auto"
    greedy = DecodeConfig.build(preset=name)
    assert greedy.strict and greedy.fuse == (name == "lossless-fused")
    sampled = DecodeConfig.build(preset=name, temperature=1.0)
    assert not sampled.strict and not sampled.fuse  # speculative sampling, unfused
    pinned = DecodeConfig.build(preset=name, temperature=1.0, acceptance="strict")
    assert pinned.strict  # a user may still pin the greedy rule (the server's s2d2.notes flags it)


def test_explicit_fusion_at_temperature_above_0_is_a_one_line_error():
    with pytest.raises(ConfigError, match="strict acceptance") as exc:
        DecodeConfig.build(preset="lossless-fused", temperature=1.0, fuse=True)
    assert "\n" not in str(exc.value)


def test_the_shipped_default_samples_exactly_too():
    model = s2d2.load("tiny-gsm")
    assert model.preset.settings["acceptance"] == "auto"
    assert model.default_config().strict and model.default_config().fuse
    sampled = model.make_config(temperature=1.0, seed=3)
    assert not sampled.strict and not sampled.fuse and sampled.block_size == 8
    assert sampled.fusion_blockers()  # plan="auto" leaves it as its settings say: probabilistic acceptance

"""The lossless property: with the ``lossless`` preset (strict greedy acceptance, verification on every
step, a quota of one token per step, a causal cache), S2D2 reproduces AR greedy decoding token for token.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples

BLOCK_SIZES = (2, 4, 8, 16)


def _prompts(vocab: int, mask_id: int, max_len: int):
    token = st.integers(0, vocab - 1).filter(lambda t: t != mask_id)
    return st.lists(token, min_size=1, max_size=max_len)


def _check_lossless(model, prompt, max_new, ignore_eos):
    ar = model.generate(prompt, decoder="ar", max_new_tokens=max_new, ignore_eos=ignore_eos)
    for b in BLOCK_SIZES:
        out = model.generate(
            prompt, preset="lossless", block_size=b, max_new_tokens=max_new, ignore_eos=ignore_eos
        )
        assert out.token_ids == ar.token_ids, f"block size {b}: {out.token_ids} != AR {ar.token_ids}"
        assert out.stats.nfe_verify == out.stats.verify_steps == out.stats.nfe_draft
        assert out.stats.fallback_commits == 0


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_random_model(random_sdar, data):
    info = random_sdar.info
    prompt = data.draw(_prompts(info.vocab_size, info.mask_token_id, 13), label="prompt")
    max_new = data.draw(st.integers(1, 10), label="max_new_tokens")
    ignore_eos = data.draw(st.booleans(), label="ignore_eos")
    _check_lossless(random_sdar, prompt, max_new, ignore_eos)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_fixture(sdar_fixture, data):
    info = sdar_fixture.info
    prompt = data.draw(_prompts(info.vocab_size, info.mask_token_id, 13), label="prompt")
    max_new = data.draw(st.integers(1, 10), label="max_new_tokens")
    _check_lossless(sdar_fixture, prompt, max_new, ignore_eos=True)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_sdar_moe(sdar_moe_model, data):
    """The SDAR-MoE checkpoint (routed experts) too, with fewer examples."""
    model = sdar_moe_model
    prompt = data.draw(_prompts(model.info.vocab_size, model.info.mask_token_id, 13), label="prompt")
    _check_lossless(model, prompt, data.draw(st.integers(1, 10), label="max_new_tokens"), ignore_eos=True)


def test_lossless_needs_the_causal_cache(sdar_fixture):
    """The property is not vacuous: a block-causal cache breaks it on the fixture."""
    prompts = [
        [17, 42, 101, 7, 250, 3, 88, 199, 5, 9, 11],
        [3, 1, 4, 1, 5, 9, 2, 6, 5],
        [100, 200, 300, 400, 7],
    ]
    differs = 0
    for p in prompts:
        ar = sdar_fixture.generate(p, decoder="ar", max_new_tokens=12, ignore_eos=True)
        blk = sdar_fixture.generate(
            p, preset="lossless", block_size=4, causal_cache=False, max_new_tokens=12, ignore_eos=True
        )
        differs += blk.token_ids != ar.token_ids
    assert differs > 0


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_lossless_stats_consistent(random_sdar, block_size):
    out = random_sdar.generate(
        [1, 2, 3, 4, 5], preset="lossless", block_size=block_size, max_new_tokens=20, ignore_eos=True
    )
    s = out.stats
    assert s.generated_tokens == 20
    # every step commits its accepted prefix plus one correction, or the whole remaining span
    assert s.accepted <= s.drafted
    assert s.nfe == s.nfe_prefill + s.nfe_draft + s.nfe_verify + s.nfe_commit


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_strict_rule_read_on_the_host_equals_the_device_rule(random_sdar, data):
    """A strict verification with no per-position values asked for is read off ``argmax q`` on the host;
    a traced one (or one asking for log-probabilities) computes its prefix and correction on the device.
    Both give the same accepted prefixes, corrections and so tokens, batch of several spans included."""
    info = random_sdar.info
    prompts = data.draw(st.lists(_prompts(info.vocab_size, info.mask_token_id, 11), min_size=1, max_size=4))
    settings_ = data.draw(
        st.sampled_from(
            [
                dict(preset="lossless", block_size=4),
                dict(preset="lossless", block_size=8),
                dict(decoder="s2d2", block_size=8, policy="always", acceptance="strict", threshold=0.5),
            ]
        ),
        label="settings",
    )
    common = dict(max_new_tokens=data.draw(st.integers(1, 12)), ignore_eos=True, **settings_)
    host = random_sdar.generate_batch(prompts, **common)
    traced = random_sdar.generate_batch(prompts, trace=True, **common)
    scored = random_sdar.generate_batch(prompts, logprobs=0, **common)
    for a, b, c in zip(host, traced, scored, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert (a.stats.accepted, a.stats.drafted) == (b.stats.accepted, b.stats.drafted)
        assert (a.stats.accepted, a.stats.verify_steps) == (c.stats.accepted, c.stats.verify_steps)

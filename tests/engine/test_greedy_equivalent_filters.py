"""Sampling filters that keep only the most likely token (``top_k`` 1, ``min_p`` 1) at a temperature
above 0 give greedy's output in every decoder: the drafter's confidences stay the model's (a one-token
distribution would make every slot certain and commit a whole block in one step)."""

from __future__ import annotations

import pytest

import s2d2

PROMPTS = [
    "Ben has 3 apples. He buys 2 more. How many apples does Ben have?",
    "A box holds 6 pens. Sam takes 2 pens. How many pens are left?",
]
DECODERS = [
    {"decoder": "ar"},
    {"decoder": "static"},
    {"decoder": "dynamic"},
    {"decoder": "eb"},
    {},
    {"preset": "lossless"},
    {"preset": "lossless-fused"},
    {"preset": "paper-sdar-a"},
    {"decoder": "s2d2", "policy": "ucb"},
]


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=4)


@pytest.mark.parametrize("settings", DECODERS, ids=lambda d: "-".join(map(str, d.values())) or "default")
def test_greedy_equivalent_filters_give_greedys_output(model, settings):
    greedy = [
        r.token_ids for r in model.generate_batch(PROMPTS, max_new_tokens=32, temperature=0, **settings)
    ]
    for filters in ({"top_k": 1}, {"min_p": 1.0}):
        got = model.generate_batch(PROMPTS, max_new_tokens=32, temperature=1.0, seed=7, **filters, **settings)
        assert [r.token_ids for r in got] == greedy, (settings, filters)


def test_a_wider_filter_still_samples(model):
    greedy = model.generate(PROMPTS[0], max_new_tokens=32, temperature=0, decoder="dynamic").token_ids
    outs = {
        tuple(
            model.generate(
                PROMPTS[0], max_new_tokens=32, temperature=1.5, top_k=50, seed=s, decoder="dynamic"
            ).token_ids
        )
        for s in range(6)
    }
    assert outs != {tuple(greedy)}

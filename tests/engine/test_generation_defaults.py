"""A checkpoint's generation defaults (``generation_config.json``: temperature 0.6, top_k 20, top_p 0.95,
as SDAR ships) leave the lossless presets lossless: greedy where the preset asks for it (AR's exact
tokens), and at the defaults' temperature equal in distribution to AR sampling under the same filters."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import s2d2
from conftest import make_random_sdar

GENERATION_CONFIG = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
#: Samples per decoder (fixed seeds). Two samples of AR's own distribution of the first two tokens lie
#: about 0.1 apart in total variation; AR without the defaults' temperature about 0.4.
N, BOUND = 600, 0.2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_random_sdar(tmp_path_factory.mktemp("gen_defaults"), vocab=48, seed=3, std=0.3)
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=32)


def _pairs(model, **settings) -> Counter:
    per = [{"seed": i} for i in range(N)]
    outs = model.generate_batch(
        [[1, 2, 3]] * N, per_request=per, max_new_tokens=2, ignore_eos=True, **settings
    )
    return Counter(tuple(o.token_ids) for o in outs)


def _tv(a: Counter, b: Counter) -> float:
    return sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / (2 * N)


def test_the_defaults_apply_and_lossless_stays_greedy_when_asked(model):
    cfg = model.make_config(preset="lossless")
    assert (cfg.temperature, cfg.top_k, cfg.top_p) == (0.0, 20, 0.95)
    prompts = [[1, 2, 3], [4, 5], [7, 8, 9, 10]]
    ar = model.generate_batch(prompts, decoder="ar", temperature=0.0, max_new_tokens=12, ignore_eos=True)
    lossless = model.generate_batch(prompts, preset="lossless", max_new_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in lossless] == [o.token_ids for o in ar]


def test_lossless_sampling_at_the_defaults_equals_ar_in_distribution(model):
    assert model.default_config().temperature == 0.6
    ar = _pairs(model, decoder="ar")
    lossless = _pairs(model, preset="lossless", temperature=0.6, acceptance="probabilistic")
    hotter = _pairs(model, decoder="ar", temperature=1.0)  # the test can tell distributions apart
    assert _tv(ar, lossless) < BOUND < _tv(ar, hotter)

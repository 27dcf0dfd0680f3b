"""``ucb_scope``: UCB statistics per request (default) or shared by every request of one engine."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_model_path
from s2d2.config import DecodeConfig
from s2d2.decoding.policies import UCB, make_policy
from s2d2.decoding.routing_state import EngineRoutingState
from s2d2.errors import ConfigError


def _prompts() -> list[str]:
    from s2d2.bench.suites import load_problems

    return [p["question"] for p in load_problems("tiny-gsm", "dev", 3)]


def test_ucb_scope_is_validated():
    assert DecodeConfig().ucb_scope == "request"
    assert DecodeConfig.build(ucb_scope="engine").ucb_scope == "engine"
    with pytest.raises(ConfigError, match="ucb_scope"):
        DecodeConfig.build(ucb_scope="global")


def test_ucb_reward_and_entropy_scale_resolve_by_scope():
    request, engine = DecodeConfig(), DecodeConfig.build(ucb_scope="engine")
    assert (request.ucb_checked, request.ucb_log_entropy) == (False, False)  # the paper's bandit
    assert (engine.ucb_checked, engine.ucb_log_entropy) == (True, True)
    mixed = DecodeConfig.build(ucb_scope="engine", ucb_reward="committed", ucb_entropy_scale="log")
    assert (mixed.ucb_checked, mixed.ucb_log_entropy) == (False, True)
    assert DecodeConfig.build(ucb_reward="checked").ucb_log_entropy  # follows the reward when auto
    for bad, match in [
        (dict(ucb_reward="tokens"), "invalid ucb_reward 'tokens'; choose one of: auto, committed, checked"),
        (dict(ucb_entropy_scale="sqrt"), "invalid ucb_entropy_scale"),
        (dict(ucb_error_cost=-1.0), "ucb_error_cost must be >= 0"),
        (dict(ucb_error_cost=float("nan")), "ucb_error_cost must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=match):
            DecodeConfig.build(**bad)


def test_make_policy_shares_tables_by_settings():
    shared = EngineRoutingState()
    eng = DecodeConfig.build(policy="ucb", ucb_scope="engine", seed=1)
    a, b = make_policy(eng, shared), make_policy(eng.replace(seed=2, max_new_tokens=9), shared)
    assert isinstance(a, UCB) and a.stats is b.stats  # per-request settings do not split the table
    assert make_policy(eng.replace(block_size=8), shared).stats is not a.stats
    req = DecodeConfig.build(policy="ucb")
    assert make_policy(req, shared).stats is not a.stats and not make_policy(req, shared).stats
    assert make_policy(eng).stats == {}  # no engine state given: the request's own


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_a_second_batch_starts_from_the_first_batchs_statistics():
    import s2d2

    m = s2d2.load("tiny-gsm", max_num_seqs=8)
    prompts = _prompts()
    # the paper's reward, which acts on a few steps' statistics (the checked reward waits for more)
    settings = dict(
        policy="ucb", ucb_scope="engine", ucb_reward="committed", block_size=8, max_new_tokens=24, seed=0
    )
    first = m.generate_batch(prompts, **settings)
    state = m.engine.routing
    pulls = state.total_pulls()
    assert len(state.tables) == 1 and pulls == sum(r.stats.steps for r in first) > 0
    # the next batch's policies see the first batch's counts: no arm is untried any more in the contexts
    # the first batch met, so the first step of each request exploits rather than explores
    (table,) = state.tables.values()
    snapshot = {ctx: {arm: s.pulls for arm, s in arms.items()} for ctx, arms in table.items()}
    second = m.generate_batch(prompts, **settings)
    assert state.total_pulls() == pulls + sum(r.stats.steps for r in second)
    for ctx, arms in snapshot.items():
        for arm, n in arms.items():
            assert table[ctx][arm].pulls >= n
    # request scope learns nothing across requests and leaves the engine's state alone
    m.generate_batch(prompts, **{**settings, "ucb_scope": "request"})
    assert state.total_pulls() == pulls + sum(r.stats.steps for r in second)
    # a fresh engine reproduces the first batch exactly, so the second batch's different routing (same
    # prompts, same seeds) comes from the statistics it inherited
    fresh = s2d2.load("tiny-gsm", max_num_seqs=8).generate_batch(prompts, **settings)
    verify = [r.stats.verify_steps for r in first]
    assert [r.stats.verify_steps for r in fresh] == verify
    assert [r.stats.verify_steps for r in second] != verify


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_engine_scope_learns_where_skipping_is_safe():
    """With the checked reward, a second pass over the same problems skips many verifications and still
    returns exactly always-verify's tokens; the paper's reward skips too, but changes answers."""
    import s2d2
    from s2d2.bench.suites import load_problems

    prompts = [p["question"] for p in load_problems("tiny-gsm", "dev", 64)]
    base = dict(decoder="s2d2", block_size=8, acceptance="strict", max_new_tokens=96, seed=0)
    always = s2d2.load("tiny-gsm", max_num_seqs=16, use_preset=False).generate_batch(
        prompts, policy="always", **base
    )
    verifications = sum(r.stats.verify_steps for r in always)

    def two_passes(**ucb):
        m = s2d2.load("tiny-gsm", max_num_seqs=16, use_preset=False)
        m.generate_batch(prompts, policy="ucb", ucb_scope="engine", **ucb, **base)
        second = m.generate_batch(prompts, policy="ucb", ucb_scope="engine", **ucb, **base)
        same = sum(a.token_ids == b.token_ids for a, b in zip(always, second, strict=True))
        return sum(r.stats.verify_steps for r in second), same

    checked, same = two_passes()  # ucb_reward "auto" = checked at engine scope
    assert checked <= 0.75 * verifications and same == len(prompts), (checked, verifications, same)
    paper, same = two_passes(ucb_reward="committed")
    assert paper < checked and same < len(prompts) - 8, (paper, same)


@pytest.mark.skipif(tiny_model_path() is None, reason="the built-in tiny-gsm model is not installed")
def test_a_routing_state_file_continues_an_engine_exactly(tmp_path):
    """An engine started from another engine's written statistics routes exactly as that engine does."""
    import s2d2
    from s2d2.decoding.routing_state import EngineRoutingState

    prompts = _prompts()
    settings = dict(policy="ucb", ucb_scope="engine", ucb_reward="committed", block_size=8, max_new_tokens=24)
    a = s2d2.load("tiny-gsm", max_num_seqs=8)
    a.generate_batch(prompts, **settings)
    a.engine.routing.write(tmp_path / "state.json")
    b = s2d2.load("tiny-gsm", max_num_seqs=8)
    b.engine.routing = EngineRoutingState.read(tmp_path / "state.json")
    assert b.engine.routing == a.engine.routing and b.engine.routing.total_pulls() > 0
    fresh = s2d2.load("tiny-gsm", max_num_seqs=8).generate_batch(prompts, **settings)
    after_a, after_b = a.generate_batch(prompts, **settings), b.generate_batch(prompts, **settings)
    assert [r.token_ids for r in after_a] == [r.token_ids for r in after_b]
    assert [r.stats.verify_steps for r in after_a] == [r.stats.verify_steps for r in after_b]
    assert [r.stats.verify_steps for r in after_b] != [r.stats.verify_steps for r in fresh]  # it learnt
    assert b.engine.routing == a.engine.routing


def test_routing_state_files_are_checked(tmp_path):
    from s2d2.decoding.routing_state import ArmStats, EngineRoutingState
    from s2d2.errors import S2D2Error

    state = EngineRoutingState()
    state.table(DecodeConfig.build(policy="ucb", ucb_scope="engine"))[(0, 1, 0)] = {
        True: ArmStats(3, 4.5, 21, 2),
        False: ArmStats(1, 2.0),
    }
    path = tmp_path / "s.json"
    state.write(path)
    assert EngineRoutingState.read(path) == state
    good = json.loads(path.read_text(encoding="utf-8"))
    bad_arm = json.loads(json.dumps(good))
    bad_arm["tables"][0]["contexts"][0]["verify"]["pulls"] = -1
    no_contexts = json.loads(json.dumps(good))
    del no_contexts["tables"][0]["contexts"]
    cases = [
        ("{not json", "not valid JSON"),
        (json.dumps({"format": "x"}), "not an s2d2 routing-state file"),
        (json.dumps({**good, "version": 9}), "unsupported version 9"),
        (json.dumps(bad_arm), "malformed table"),
        (json.dumps(no_contexts), "malformed table"),
    ]
    for text, message in cases:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(S2D2Error, match=message):
            EngineRoutingState.read(path)
    with pytest.raises(S2D2Error, match="cannot read the routing state"):
        EngineRoutingState.read(tmp_path / "missing.json")
    with pytest.raises(S2D2Error, match="cannot write"):
        state.write(tmp_path / "s.json" / "inside-a-file.json")

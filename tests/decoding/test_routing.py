"""Routing policies and acceptance estimators on constructed inputs (ALGORITHM.md section 4)."""

from __future__ import annotations

import math

import pytest
import torch

from s2d2.config import DecodeConfig
from s2d2.decoding import functional as F
from s2d2.decoding.policies import POLICIES, UCB, Hysteresis, Policy, RouteFeatures, SkipCheck, make_policy

V = 4


def dist(*rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- estimators
def test_estimators_on_constructed_distributions():
    probs = dist([0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0])
    drafts = torch.tensor([0, 1, 0])
    margin = torch.tensor([0.5, 0.0, 1.0])
    h = F.normalized_entropy(probs)
    h0 = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)) / math.log(V)
    torch.testing.assert_close(h, torch.tensor([h0, 1.0, 0.0]))
    torch.testing.assert_close(F.margin(probs), margin)

    est = lambda name, param: F.acceptance_estimate(name, probs, drafts, param)  # noqa: E731
    torch.testing.assert_close(est("hard-margin", 0.05), torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(est("hard-entropy", 0.1), torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(est("confidence-power", 0.8), torch.tensor([0.7**0.8, 0.25**0.8, 1.0]))
    torch.testing.assert_close(est("clipped-margin", 1.5), torch.tensor([0.75, 0.0, 1.0]))
    torch.testing.assert_close(est("soft-entropy", 2.0), torch.exp(-2.0 * torch.tensor([h0, 1.0, 0.0])))
    torch.testing.assert_close(est("renyi2", None), torch.tensor([0.49 + 0.04 + 0.01, 0.25, 1.0]))


def test_expected_accept_length_and_scores():
    alpha = torch.tensor([0.9, 0.5, 1.0, 0.0])
    # 0.9 + 0.45 + 0.45 + 0
    assert F.expected_accept_length(alpha) == pytest.approx(1.8)
    assert F.expected_accept_length(torch.ones(5)) == pytest.approx(5.0)
    assert F.verify_score(1.8, kind="static", penalty=1.0) == pytest.approx(0.8)
    assert F.verify_score(1.8, kind="dynamic", penalty=0.5, n_dynamic=3) == pytest.approx(0.3)
    assert F.verify_score(1.8, kind="dynamic", penalty=4.0, n_dynamic=0) == pytest.approx(1.8)


# ---------------------------------------------------------------------------------------------- policies
def features(
    cfg: DecodeConfig, probs: torch.Tensor, n_dynamic: int = 0, progress: float = 0.0
) -> RouteFeatures:
    drafts = probs.argmax(-1)
    return RouteFeatures(
        span_len=int(drafts.numel()),
        alpha=F.acceptance_estimate(cfg.estimator, probs, drafts, cfg.estimator_value).tolist(),
        norm_entropy=F.normalized_entropy(probs).tolist(),
        block_size=cfg.block_size,
        progress=progress,
        n_dynamic=n_dynamic,
        config=cfg,
    )


CONFIDENT = dist([1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])  # E[K] = 3 (soft entropy)
UNSURE = dist([0.25] * 4, [0.25] * 4)  # H = 1 -> alpha = e^-1 each: E[K] = e^-1 + e^-2


def test_never_always_minspan():
    cfg = DecodeConfig.build(block_size=8, min_span=3)
    assert not make_policy(cfg.replace(policy="never")).decide(features(cfg, CONFIDENT))
    assert make_policy(cfg.replace(policy="always")).decide(features(cfg, UNSURE))
    ms = make_policy(cfg.replace(policy="min-span"))
    assert ms.decide(features(cfg, CONFIDENT))  # span 3 >= 3
    assert not ms.decide(features(cfg, UNSURE))  # span 2 < 3


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_fixed_decision_is_the_policys_decision_whatever_the_features(name):
    """The step skips the features of a policy with ``fixed`` set: it must decide so on any features,
    and learn nothing from them."""
    cfg = DecodeConfig.build(block_size=8, min_span=3)
    policy = make_policy(cfg.replace(policy=name))
    if policy.fixed is None:
        return
    for probs in (CONFIDENT, UNSURE):
        for n_dynamic, progress in ((0, 0.0), (3, 0.9)):
            assert policy.decide(features(cfg, probs, n_dynamic, progress)) is policy.fixed
    assert not policy.learns_from_checks and not policy.reads_alpha and not policy.reads_entropy
    assert type(policy).update is Policy.update  # the base class's: it ignores its feedback


def test_score_threshold_static_and_dynamic():
    cfg = DecodeConfig.build(block_size=8, policy="score", score="static", penalty=1.0, score_threshold=0.0)
    f = features(cfg, CONFIDENT)
    assert f.expected_len == pytest.approx(3.0)
    assert f.score == pytest.approx(2.0)
    assert make_policy(cfg).decide(f)
    e_unsure = math.exp(-1) + math.exp(-2)
    f = features(cfg, UNSURE)
    assert f.score == pytest.approx(e_unsure - 1.0)
    assert not make_policy(cfg).decide(f)
    # dynamic: penalty c x (positions the dynamic rule would commit anyway)
    dyn = cfg.replace(score="dynamic", penalty=1.0, score_threshold=0.5)
    assert features(dyn, CONFIDENT, n_dynamic=3).score == pytest.approx(0.0)
    assert not make_policy(dyn).decide(features(dyn, CONFIDENT, n_dynamic=3))
    assert make_policy(dyn).decide(features(dyn, CONFIDENT, n_dynamic=2))  # 3 - 2 = 1 >= 0.5


def test_hysteresis_switches_both_ways():
    cfg = DecodeConfig.build(
        block_size=8,
        policy="hysteresis",
        score="dynamic",
        penalty=1.0,
        hysteresis_on=1.0,
        hysteresis_off=-1.0,
    )
    pol = make_policy(cfg)
    assert isinstance(pol, Hysteresis) and not pol.on  # starts off
    seq = [  # (n_dynamic, expected decision); score = 3 - n_dynamic
        (2, False),  # s = 1: not > on (1)
        (1, True),  # s = 2 > 1: switches on
        (3, True),  # s = 0 >= off (-1): stays on
        (4, True),  # s = -1 >= -1: stays on
        (5, False),  # s = -2 < -1: switches off
        (3, False),  # s = 0: off stays off (needs > 1)
        (0, True),  # s = 3: on again
    ]
    for n_dyn, want in seq:
        assert pol.decide(features(cfg, CONFIDENT, n_dynamic=n_dyn)) is want, (n_dyn, want)


def test_ucb_untried_arm_first_then_bonus():
    cfg = DecodeConfig.build(block_size=8, policy="ucb", ucb_beta=1.0, ucb_bins=2)
    pol = make_policy(cfg)
    assert isinstance(pol, UCB)
    f = features(cfg, CONFIDENT)
    assert pol.context(f) == (0, 0, 0)  # span 3 over [1, 8]: (3 - 1) / 7 * 2 = 0.57 -> bin 0
    first = pol.decide(f)
    assert first is True  # untried: verify first
    pol.update(f, True, committed=4)  # reward 4 / 2 = 2
    assert pol.decide(f) is False  # skip still untried
    pol.update(f, False, committed=1)  # reward 1
    # both tried once: t = 2, bonus equal -> larger mean wins (verify: 2 > 1)
    assert pol.bonus(2, 1) == pytest.approx(math.sqrt(math.log(2)))
    assert pol.decide(f) is True
    # make skip's mean higher: verify pulls with low reward
    for _ in range(5):
        pol.update(f, True, committed=1)  # reward 0.5 each -> verify mean (2 + 2.5) / 6 = 0.75
    # skip: mean 1 + sqrt(ln 7 / 1) = 2.39; verify: 0.75 + sqrt(ln 7 / 6) = 1.32
    assert pol.decide(f) is False
    # a different context bucket starts untried again
    g = features(cfg, UNSURE, progress=0.9)
    assert pol.context(g) != pol.context(f)
    assert pol.decide(g) is True


def test_skip_check_counts_commits_the_verification_did_not_accept():
    picks = torch.tensor([0, 1, 2])
    assert SkipCheck.of(picks, span_off=0, n_accepted=3) == SkipCheck(3, 0)
    assert SkipCheck.of(picks, span_off=0, n_accepted=2) == SkipCheck(3, 1)  # the first rejected slot
    assert SkipCheck.of(picks, span_off=0, n_accepted=0) == SkipCheck(3, 3)
    # span from candidate 1 (candidate 0 committed before routing); candidate 5 lies past the accepted
    # prefix and candidate 0 before the span: neither was vouched for by this verification
    assert SkipCheck.of(torch.tensor([0, 1, 2, 5]), span_off=1, n_accepted=4) == SkipCheck(4, 2)
    assert SkipCheck.of(torch.tensor([], dtype=torch.long), span_off=0, n_accepted=2) == SkipCheck(0, 0)


def test_ucb_checked_reward_skips_only_once_checks_clear_the_prior():
    cfg = DecodeConfig.build(block_size=8, policy="ucb", ucb_reward="checked", ucb_error_cost=64.0)
    pol = make_policy(cfg)
    assert pol.learns_from_checks and not make_policy(DecodeConfig.build(policy="ucb")).learns_from_checks
    f = features(cfg, CONFIDENT)
    # every check: verification committed 8 (reward 4), skipping would have committed 8, all vouched.
    # Skip estimate (8n - 64) / (n + 1) must beat 4 by 2 sqrt(ln n / n): first true at n = 22
    for n in range(22):
        assert pol.decide(f) is True, n
        pol.update(f, True, committed=8, check=SkipCheck(8, 0))
    assert pol.decide(f) is False
    pol.update(f, False, committed=8)  # a skip's own outcome teaches nothing about its errors
    verify_arm = pol.stats[pol.context(f)][True]
    assert (verify_arm.skip_commits, verify_arm.skip_unvouched) == (22 * 8, 0)
    # one check where skipping would have committed 3 unvouched tokens: back to verifying
    pol.update(f, True, committed=3, check=SkipCheck(8, 3))
    assert pol.decide(f) is True
    # the error cost prices it: at cost 0 the same statistics favour skipping
    free = UCB(cfg.replace(ucb_error_cost=0.0), stats=pol.stats)
    assert free.decide(f) is False


def test_ucb_log_entropy_bins_separate_what_linear_bins_merge():
    probs = lambda h: dist(*[[1 - h, h / 3, h / 3, h / 3]] * 3)  # noqa: E731
    low, high = probs(1e-5), probs(0.05)
    lin = make_policy(DecodeConfig.build(block_size=8, policy="ucb"))
    log = make_policy(DecodeConfig.build(block_size=8, policy="ucb", ucb_entropy_scale="log"))
    cfg = lin.config
    assert lin.context(features(cfg, low)) == lin.context(features(cfg, high))  # both below 0.5
    ent = [features(cfg, p).mean_entropy for p in (low, high)]
    assert ent[0] < 1e-2 < ent[1]  # log10 bins over [-4, 0]: split at 1e-2 with 2 bins
    assert log.context(features(cfg, low))[2] == 0 and log.context(features(cfg, high))[2] == 1


def test_ucb_context_bins():
    cfg = DecodeConfig.build(block_size=9, policy="ucb", ucb_bins=2)
    pol = make_policy(cfg)
    one = dist([1.0, 0, 0, 0])
    assert pol.context(features(cfg, one, progress=0.0)) == (0, 0, 0)
    long = dist(*([[0.25] * 4] * 9))
    assert pol.context(features(cfg, long, progress=1.0)) == (1, 1, 1)


# ---------------------------------------------------------------------------------------------- baselines
def test_quota_split():
    assert [F.quota(s, 8, 3) for s in range(3)] == [3, 3, 2]
    assert [F.quota(s, 4, 4) for s in range(4)] == [1, 1, 1, 1]
    assert F.quota(0, 4, 1) == 4
    assert sum(F.quota(s, 16, 5) for s in range(5)) == 16


def test_baseline_rules():
    conf = torch.tensor([0.2, 0.95, 0.5, 0.91, 0.3])
    assert sorted(F.select_static(conf, 2).tolist()) == [1, 3]
    assert sorted(F.select_dynamic(conf, 0.9, 1).tolist()) == [1, 3]
    assert sorted(F.select_dynamic(conf, 0.99, 2).tolist()) == [1, 3]  # too few above tau: quota's best
    assert sorted(F.select_dynamic(conf, 0.9, 3).tolist()) == [1, 2, 3]
    ent = torch.tensor([0.5, 0.01, 0.2, 0.02, 0.9])
    assert sorted(F.select_entropy_bounded(ent, 0.05).tolist()) == [1, 3]
    assert F.select_entropy_bounded(ent, 0.001).tolist() == [1]  # at least one
    assert sorted(F.select_entropy_bounded(ent, 0.25).tolist()) == [1, 2, 3]


def test_sampling_transforms():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = F.probs_from_logits(logits, temperature=0.0)
    torch.testing.assert_close(p, torch.softmax(logits, -1))
    p = F.probs_from_logits(logits, temperature=0.5)
    torch.testing.assert_close(p, torch.softmax(logits / 0.5, -1))
    p = F.probs_from_logits(logits, temperature=1.0, top_k=2)
    assert (p[0, 2:] == 0).all() and p.sum() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)[0]  # [0.64, 0.24, 0.09, 0.03]
    p = F.probs_from_logits(logits, temperature=1.0, top_p=0.8)
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    p = F.probs_from_logits(logits, temperature=1.0, top_p=float(full[0]) - 0.01)
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]

"""The ``syntax`` routing policy: static checks of the drafted span decide where to verify.

Contracts: a span the checks find dead is verified whatever its score; with ``key_positions`` a span
holding a key position whose acceptance estimate is below ``key_confidence`` is verified; elsewhere the
policy is the score rule, and without a tokenizer it is the score rule throughout. In the engine (the
families' checkpoints, ids decoded by a stand-in tokenizer): a policy whose every span is dead decodes as
``always`` does, one whose spans never are as ``score`` does.
"""

from __future__ import annotations

import pytest

from s2d2.config import DecodeConfig
from s2d2.decoding.policies import RouteFeatures, Syntax, make_policy
from s2d2.decoding.routing_state import EngineRoutingState
from s2d2.decoding.syntax_view import SpanSource

#: a stand-in tokenizer: token id -> text
PIECES = {0: 'def f(x):\n    """Add."""', 1: "\n    ", 2: "return", 3: " x", 4: " +", 5: " 1", 6: ")", 7: "]"}


def detokenize(ids):
    return "".join(PIECES[i] for i in ids)


def features(cfg: DecodeConfig, span: list[int], alpha: list[float], policy) -> RouteFeatures:
    return RouteFeatures(
        span_len=len(span),
        alpha=alpha,
        norm_entropy=None,
        block_size=cfg.block_size,
        progress=0.0,
        n_dynamic=0,
        config=cfg,
        source=SpanSource([0], [1, 2], span, final=False),
        syntax=policy.syntax,
    )


def make(**settings) -> Syntax:
    cfg = DecodeConfig.build(decoder="s2d2", block_size=4, policy="syntax", **settings)
    shared = EngineRoutingState()
    shared.detokenize = detokenize
    policy = make_policy(cfg, shared)
    assert isinstance(policy, Syntax) and policy.syntax is not None
    return policy


def test_a_dead_span_is_verified_whatever_its_score():
    policy = make(score_threshold=1e6)  # the score rule alone never verifies
    cfg = policy.config
    assert not policy.decide(features(cfg, [3, 4, 5], [1.0, 1.0, 1.0], policy))
    f = features(cfg, [3, 6], [1.0, 1.0], policy)  # "return x)": closes nothing
    assert f.syntax_dead and policy.decide(f)
    assert policy.syntax.checks == 2 and policy.syntax.dead_spans == 1 and policy.syntax.seconds > 0


def test_elsewhere_the_score_rule_decides():
    policy = make(score_threshold=0.0)
    cfg = policy.config
    assert policy.decide(features(cfg, [3, 4, 5], [1.0, 1.0, 1.0], policy))  # E[K] - 1 = 2 >= 0
    assert not policy.decide(features(cfg, [3, 4, 5], [0.1, 0.1, 0.1], policy))


def test_key_positions_force_verification_where_unsure():
    policy = make(score_threshold=1e6, key_positions=True, key_confidence=0.9)
    cfg = policy.config
    # " x" (a name after return) and " +" (an operator) are key positions; " 1" is not
    assert not policy.decide(features(cfg, [3, 4, 5], [0.95, 0.95, 0.2], policy))
    assert policy.decide(features(cfg, [3, 4, 5], [0.95, 0.5, 1.0], policy))
    off = make(score_threshold=1e6, key_positions=False)
    assert not off.decide(features(off.config, [3, 4, 5], [0.95, 0.5, 1.0], off))


def test_without_a_tokenizer_it_is_the_score_rule():
    cfg = DecodeConfig.build(decoder="s2d2", block_size=4, policy="syntax", score_threshold=0.0)
    policy = make_policy(cfg, EngineRoutingState())
    assert policy.syntax is None
    f = features(cfg, [3, 6], [1.0, 1.0], policy)
    assert not f.syntax_dead and policy.decide(f)


def test_unknown_language_is_a_setting_error():
    from s2d2.errors import ConfigError

    with pytest.raises(ConfigError, match="syntax_language"):
        DecodeConfig.build(policy="syntax", syntax_language="cobol")


@pytest.mark.parametrize("family", ["random", "sdar", "llada2"])
def test_in_the_engine_dead_everywhere_is_always_and_never_dead_is_score(family, random_sdar, request):
    from conftest import load_or_skip

    model = random_sdar if family == "random" else load_or_skip(family)
    vocab = model.info.vocab_size
    prompt = [3, 4, 5, 6, 7]
    settings = dict(decoder="s2d2", block_size=4, max_new_tokens=16, score_threshold=1.5, ignore_eos=True)

    def run(policy: str, piece: str):
        # the prompt decodes as nothing (an empty program), every generated token as ``piece``
        model.engine.routing.detokenize = lambda ids: piece * max(0, len(ids) - len(prompt))
        try:
            return model.generate(prompt, policy=policy, **settings)
        finally:
            model.engine.routing.detokenize = None

    dead = run("syntax", ")")  # every span closes a bracket never opened
    always = run("always", ")")
    assert dead.token_ids == always.token_ids
    assert dead.stats.verify_steps == always.stats.verify_steps > 0
    alive = run("syntax", " x")  # " x x x": one line being written, never completed: never dead
    score = run("score", " x")
    assert alive.token_ids == score.token_ids and alive.stats.verify_steps == score.stats.verify_steps
    assert vocab > max(prompt)

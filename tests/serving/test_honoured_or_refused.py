"""Every request field and decoding setting is honoured or refused, never accepted and dropped (issue 52).

Unknown top-level fields and ``stream_options`` keys are a 400 naming them (as OpenAI's API answers);
the fields that only describe the caller are accepted with no effect; every numeric decoding setting is
range-checked whatever the decoder, policy or family (``s2d2.setting_ranges``); an empty body gets a
clear message. Real HTTP against a real server with the official ``openai`` client.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.config import PRESETS, DecodeConfig  # noqa: E402
from s2d2.errors import ConfigError  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.setting_ranges import FLOAT_RANGES, INT_RANGES  # noqa: E402

Q = "Tom has 3 apples. He buys 4 more. How many apples does he have?"
CHAT = [{"role": "user", "content": Q}]


@pytest.fixture(scope="module")
def url():
    model = s2d2.load("tiny-gsm", max_num_seqs=4)
    with running_server(create_app(model, max_num_seqs=4)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _create(client, chat: bool, **kw):
    if chat:
        return client.chat.completions.create(model="tiny-gsm", messages=CHAT, max_tokens=16, **kw)
    return client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16, **kw)


# ------------------------------------------------------------------------------------------ unknown fields
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize(
    "extra,named",
    [
        ({"foo_bar": 1}, ["foo_bar"]),
        ({"foo_bar": 1, "temprature": 0.5}, ["foo_bar", "temprature"]),
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            ["stream_options.continuous_usage_stats"],
        ),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, ["stream_options.x"]),
    ],
    ids=["one", "two", "stream-option", "stream-option-beside-a-known-one"],
)
def test_unknown_fields_are_a_400_naming_every_one(client, chat, extra, named):
    with pytest.raises(openai.BadRequestError) as exc:
        _create(client, chat, extra_body=extra)
    err = exc.value.body
    assert err["param"] == named[0] and err["code"] == "unknown_parameter", err
    assert all(name in err["message"] for name in named) and "\n" not in err["message"]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_caller_fields_are_accepted_and_change_nothing(client, chat):
    plain = _create(client, chat)
    # chat's client takes them as arguments; the legacy completions client only `user` (the rest as body)
    caller = {"metadata": {"team": "eval"}, "store": False, "service_tier": "auto"}
    if chat:
        tagged = _create(client, chat, user="u1", **caller)
    else:
        tagged = _create(client, chat, user="u1", extra_body=caller)
    text = (lambda r: r.choices[0].message.content) if chat else (lambda r: r.choices[0].text)
    assert text(tagged) == text(plain) and tagged.usage.completion_tokens == plain.usage.completion_tokens


def test_existing_fields_and_extensions_are_still_accepted(client):
    """vLLM's extras and the s2d2 object keep working (no field handled before became unknown)."""
    out = client.completions.create(
        model="tiny-gsm",
        prompt=Q,
        max_tokens=8,
        stream=False,
        extra_body={
            "top_k": 1,
            "min_tokens": 1,
            "ignore_eos": True,
            "stop_token_ids": [],
            "s2d2": {"decoder": "ar"},
            "response_format": {"type": "text"},
            "tools": [],
            "tool_choice": "none",
        },
    )
    assert out.usage.completion_tokens == 8


def test_an_empty_body_says_so(url):
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = httpx.post(url + path, content=b"", headers={"content-type": "application/json"})
        err = resp.json()["error"]
        assert resp.status_code == 400 and err["code"] == "missing_body", err
        assert "empty" in err["message"] and "None" not in err["message"]


# ------------------------------------------------------------------------------------------ setting ranges
@pytest.mark.parametrize(
    "settings,param",
    [
        ({"ucb_beta": 1.8e19}, "s2d2.ucb_beta"),  # the policy is "always": UCB never reads it
        ({"post_steps": 100000}, "s2d2.post_steps"),  # no token editing on this family
        ({"policy": "ucb", "ucb_beta": 1e4}, "s2d2.ucb_beta"),
        ({"ucb_error_cost": 1e29}, "s2d2.ucb_error_cost"),
        ({"predraft_tokens": 10**9}, "s2d2.predraft_tokens"),  # not fused
        ({"min_span": 10**7}, "s2d2.min_span"),
        ({"estimator_param": -1.0}, "s2d2.estimator_param"),
    ],
)
def test_settings_out_of_range_are_a_400_whatever_the_policy(client, settings, param):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=8, extra_body={"s2d2": settings})
    assert exc.value.body["param"] == param, exc.value.body


def _outside(name: str) -> list:
    """Values just outside (and NaN / infinite for real-valued) the range of setting ``name``."""
    if name in INT_RANGES:
        low, high = INT_RANGES[name]
        return [low - 1, high + 1]
    low, high, _ = FLOAT_RANGES[name]
    values = [high * 2 + 1, math.nan, math.inf]
    return values + ([low] if FLOAT_RANGES[name][2] else [low - 1])


@pytest.mark.parametrize("name", sorted([*INT_RANGES, *FLOAT_RANGES]))
def test_every_ranged_setting_is_refused_outside_its_range(name):
    for value in _outside(name):
        if name == "hysteresis_off" and not value < 1.0:
            continue  # refused by the on > off check first (its own message)
        with pytest.raises(ConfigError) as exc:
            DecodeConfig.build(**{name: value})
        assert name in str(exc.value) and "\n" not in str(exc.value)


def test_presets_and_defaults_lie_inside_the_ranges():
    DecodeConfig.build()
    for preset in PRESETS:
        DecodeConfig.build(preset=preset)
    DecodeConfig.build(policy="ucb", ucb_beta=100.0, post_steps=256, gamma=1e6, min_tokens=1 << 20)

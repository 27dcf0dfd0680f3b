"""Tools with a structured final answer: ``response_format`` (json_schema / json_object) together with
``tools`` under ``tool_choice`` auto is one constraint, so every reply is either calls in the family's
markup or a final answer matching the format. Through the server's own request path (``prepare``) on a
random SDAR model (Hermes template): 20 prompts, greedy and sampled, each reply valid one way or the
other; every lossless preset gives the same tokens as constrained AR greedy under the same constraint;
under required only calls."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")

import s2d2  # noqa: E402
from s2d2.serving.prepare import prepare  # noqa: E402
from s2d2.serving.protocol import ChatCompletionRequest  # noqa: E402
from s2d2.serving.tools.reply import new_reader, reply_message  # noqa: E402
from structured_fixtures import SCHEMAS  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

PROMPTS = [f"item {i}: {'ab' * (i % 5)} {i * 7 % 13}" for i in range(20)]
MAX_NEW = 120
TOOLS = [
    {"type": "function", "function": {"name": "tag", "parameters": SCHEMAS["array"]}},
    {"type": "function", "function": {"name": "paint", "parameters": SCHEMAS["enum"]}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ANSWER = SCHEMAS["nested"]
FORMATS = {
    "json_schema": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}},
    "json_object": {"type": "json_object"},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_sdar_tool_model(tmp_path_factory.mktemp("tools_with_answer"))
    return s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=20)


def _prepared(model, fmt="json_schema", choice="auto", **settings):
    out = []
    for prompt in PROMPTS:
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "tools": TOOLS,
            "tool_choice": choice,
            "response_format": FORMATS[fmt],
            "max_tokens": MAX_NEW,
            "s2d2": settings,
        }
        out.append(prepare(model, ChatCompletionRequest.model_validate(body), served_name=model.name))
    return out


def _decode(model, preps):
    outs = model.engine.generate(
        [p.prompt_ids for p in preps], [p.config for p in preps], constraints=[p.constraint for p in preps]
    )
    return [o.token_ids for o in outs]


def _kinds(model, preps, outputs, fmt="json_schema"):
    """Each reply's kind (calls, answer, calls cut by the token limit: its complete calls kept, no markup
    in the content, or an answer cut by the limit), after checking it is valid as that kind."""
    kinds = []
    for prep, ids in zip(preps, outputs, strict=True):
        message, cut = reply_message(new_reader(prep.tools, None), model.decode_ids(ids))
        if message.get("tool_calls") or cut:
            assert not message["content"], message
            for call in message["tool_calls"]:
                jsonschema.validate(
                    json.loads(call["function"]["arguments"]), BY_NAME[call["function"]["name"]]
                )
            kinds.append("cut" if cut else "calls")
        elif len(ids) >= MAX_NEW and message["content"].startswith("{"):  # an answer cut by the limit
            kinds.append("cut answer")
        else:
            answer = json.loads(message["content"])
            jsonschema.validate(answer, ANSWER if fmt == "json_schema" else {"type": "object"})
            kinds.append("answer")
    return kinds


@pytest.fixture(scope="module")
def ar_tokens(model):
    return _decode(model, _prepared(model, decoder="ar", causal_cache=True))


def test_greedy_replies_are_calls_or_a_valid_answer(model, ar_tokens):
    kinds = _kinds(model, _prepared(model), ar_tokens)
    assert len(kinds) == 20


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sampled_replies_are_calls_or_a_valid_answer(model, fmt):
    """20 sampled replies (temperature 1, a seed each): every one is valid calls or a valid answer, and
    both kinds occur (half the replies get a logit bias toward ``{``, the answer's first character: the
    random model otherwise always opens a call)."""
    preps = _prepared(model, fmt, temperature=1.0)
    brace = model.tokenizer.convert_tokens_to_ids("{")
    for i, p in enumerate(preps):
        p.rows[0].config = p.config.replace(seed=i, logit_bias={brace: 8.0} if i % 2 else {})
    kinds = _kinds(model, preps, _decode(model, preps), fmt)
    print(fmt, {k: kinds.count(k) for k in set(kinds)})
    assert "calls" in kinds and ("answer" in kinds or fmt == "json_object" and "cut answer" in kinds), kinds
    if fmt == "json_schema":  # the schema's answers are short: none is cut
        assert "cut answer" not in kinds


@pytest.mark.parametrize("preset", ["lossless", "lossless-fused", "lossless-auto"])
def test_lossless_presets_equal_constrained_ar(model, ar_tokens, preset):
    got = _decode(model, _prepared(model, preset=preset))
    for ref, ids in zip(ar_tokens, got, strict=True):
        assert ids == ref, (preset, model.decode_ids(ids), model.decode_ids(ref))


def test_required_with_a_format_only_calls(model):
    preps = _prepared(model, choice="required")
    assert set(_kinds(model, preps, _decode(model, preps))) == {"calls"}

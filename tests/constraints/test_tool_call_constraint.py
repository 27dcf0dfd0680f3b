"""Tool calls under the structural-tag constraint (issue 61): 20 prompts x 3 schemas (nested objects,
arrays, enums) through the server's own request path (``prepare``: the chat template with ``tools``,
``tool_choice`` required), decoded by the engine. Every call parses and validates against its schema,
and every lossless preset gives the same tokens as constrained AR greedy under the same constraint."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")

import s2d2  # noqa: E402
from s2d2.serving.prepare import prepare  # noqa: E402
from s2d2.serving.protocol import ChatCompletionRequest  # noqa: E402
from s2d2.serving.tools.reply import tool_message  # noqa: E402
from structured_fixtures import SCHEMAS  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

NAMES = ("nested", "array", "enum")
PROMPTS = [f"item {i}: {'ab' * (i % 5)} {i * 7 % 13}" for i in range(20)]
MAX_NEW = 120


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_sdar_tool_model(tmp_path_factory.mktemp("tool_constraint"))
    return s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=20)


def _prepared(model, schema_name, **s2d2_settings):
    tool = {
        "type": "function",
        "function": {"name": f"use_{schema_name}", "parameters": SCHEMAS[schema_name]},
    }
    out = []
    for prompt in PROMPTS:
        body = ChatCompletionRequest.model_validate(
            {
                "messages": [{"role": "user", "content": prompt}],
                "tools": [tool],
                "tool_choice": "required",
                "max_tokens": MAX_NEW,
                "s2d2": s2d2_settings,
            }
        )
        out.append(prepare(model, body, served_name=model.name))
    return out


def _decode(model, preps):
    outs = model.engine.generate(
        [p.prompt_ids for p in preps], [p.config for p in preps], constraints=[p.constraint for p in preps]
    )
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def ar_tokens(model):
    return {name: _decode(model, _prepared(model, name, decoder="ar")) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_every_call_validates(model, ar_tokens, name):
    plan = _prepared(model, name)[0].tools
    for ids in ar_tokens[name]:
        message = tool_message(plan, model.decode_ids(ids))
        assert message["content"] is None and message["tool_calls"], message
        for call in message["tool_calls"]:
            assert call["function"]["name"] == f"use_{name}"
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize("preset", ["lossless", "lossless-fused", "lossless-auto"])
def test_lossless_presets_equal_constrained_ar(model, ar_tokens, preset):
    for name in NAMES:
        got = _decode(model, _prepared(model, name, preset=preset))
        for ref, ids in zip(ar_tokens[name], got, strict=True):
            assert ids == ref, (preset, name, model.decode_ids(ids), model.decode_ids(ref))

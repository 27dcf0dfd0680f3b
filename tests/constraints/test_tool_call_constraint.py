"""Tool calls under the structural-tag constraint (issue 61), on a random SDAR model (Hermes template) and
a random LLaDA2 model (LLaDA2-style template): 20 prompts x 3 schemas (nested objects, arrays, enums)
through the server's own request path (``prepare``: the chat template with ``tools``,
``tool_choice`` required, one call), decoded by the engine. Every call (constrained AR and the default
decoding) parses and validates against its schema, every lossless preset gives the same tokens as
constrained AR greedy under the same constraint (``decoder="ar"`` with the causal cache the presets use),
and jump-forward changes no token."""

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
from tool_fixtures import make_llada2_tool_model, make_sdar_tool_model  # noqa: E402

NAMES = ("nested", "array", "enum")
PROMPTS = [f"item {i}: {'ab' * (i % 5)} {i * 7 % 13}" for i in range(20)]
MAX_NEW = 120


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    path = make_sdar_tool_model(tmp_path_factory.mktemp("tool_constraint_sdar"))
    return s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=20)


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    path = make_llada2_tool_model(tmp_path_factory.mktemp("tool_constraint_llada2"))
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
                "parallel_tool_calls": False,
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


def _ar_tokens(model):
    """Constrained AR greedy (with the causal cache the lossless presets use)."""
    return {name: _decode(model, _prepared(model, name, decoder="ar", causal_cache=True)) for name in NAMES}


@pytest.fixture(scope="module")
def ar_tokens(sdar):
    return _ar_tokens(sdar)


@pytest.fixture(scope="module")
def llada2_ar_tokens(llada2):
    return _ar_tokens(llada2)


FAMILIES = {"sdar": "ar_tokens", "llada2": "llada2_ar_tokens"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_call_validates(request, family):
    model = request.getfixturevalue(family)
    tokens = request.getfixturevalue(FAMILIES[family])
    for name in NAMES:
        _validate(model, name, tokens[name])
    for name in NAMES:  # the default decoding (S2D2) too
        _validate(model, name, _decode(model, _prepared(model, name)))


def _validate(model, name, outputs):
    plan = _prepared(model, name)[0].tools
    for ids in outputs:
        message = tool_message(plan, model.decode_ids(ids))
        assert message["content"] is None and message["tool_calls"], message
        for call in message["tool_calls"]:
            assert call["function"]["name"] == f"use_{name}"
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize("preset", ["lossless", "lossless-fused", "lossless-auto"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_lossless_presets_equal_constrained_ar(request, family, preset):
    model, ar_tokens = request.getfixturevalue(family), request.getfixturevalue(FAMILIES[family])
    for name in NAMES:
        got = _decode(model, _prepared(model, name, preset=preset))
        for ref, ids in zip(ar_tokens[name], got, strict=True):
            assert ids == ref, (preset, name, model.decode_ids(ids), model.decode_ids(ref))


@pytest.mark.parametrize(
    "settings", [{"preset": "lossless-fused"}, {"decoder": "ar", "causal_cache": True}], ids=["fused", "ar"]
)
def test_jump_forward_keeps_the_tokens_and_saves_forwards(sdar, ar_tokens, settings):
    """Forced tokens (the grammar allows one) are committed without a forward, and forced drafts are
    filled before verification: the same tokens as without it (and as constrained AR), in fewer
    forwards, constrained AR included."""
    nfe = {}
    for on in (True, False):
        preps = [p for name in NAMES for p in _prepared(sdar, name, jump_forward=on, **settings)]
        outs = sdar.engine.generate(
            [p.prompt_ids for p in preps],
            [p.config for p in preps],
            constraints=[p.constraint for p in preps],
        )
        assert [o.token_ids for o in outs] == [ids for name in NAMES for ids in ar_tokens[name]]
        nfe[on] = sum(o.stats.nfe for o in outs)
    assert nfe[True] < 0.7 * nfe[False], nfe

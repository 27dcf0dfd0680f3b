"""Tool calling (issue 61) through the official ``openai`` client against real servers on 127.0.0.1.

Fixtures (tests/tool_fixtures.py): a random SDAR model with a Qwen/Hermes-style chat template and a
random LLaDA2 model (the shared checkpoint) with a LLaDA2/Ling-style template, both over byte-level
tokenizers. ``tool_choice`` auto (the default), required, none and named; ``parallel_tool_calls``;
streamed deltas that reassemble to exactly the whole reply's calls; a two-round conversation with the
calls and the tools' results in the history; bad input as a 400 naming the field.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from structured_fixtures import SCHEMAS  # noqa: E402
from tool_fixtures import TOOL_CALL, make_llada2_tool_model, make_sdar_tool_model  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {"name": "set_user", "description": "Store a user.", "parameters": SCHEMAS["nested"]},
    },
    {"type": "function", "function": {"name": "tag", "parameters": SCHEMAS["array"]}},
    {"type": "function", "function": {"name": "paint", "parameters": SCHEMAS["enum"]}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "user ab 3"}]
LOSSLESS = {"s2d2": {"preset": "lossless"}}


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    model = s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("sdar_tools")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=8, max_queue=64)) as base:
        yield model, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    path = make_llada2_tool_model(tmp_path_factory.mktemp("llada2_tools"))
    model = s2d2.load(path, device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4)) as base:
        yield model, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The SDAR model without a chat template: the server's fallback renders the tools."""
    path = make_sdar_tool_model(tmp_path_factory.mktemp("plain_tools"), template=None)
    model = s2d2.load(path, device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4, tool_call_parser="hermes")) as base:
        yield model, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(client, model, **kw):
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("max_tokens", 96)
    kw.setdefault("extra_body", LOSSLESS)
    return client.chat.completions.create(model=model.name, **kw)


def _validated(calls):
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), BY_NAME[call.function.name])
    return [(c.function.name, c.function.arguments) for c in calls]


def _streamed(client, model, **kw):
    """The stream's content, its calls reassembled from the deltas, the finish reason; checks that a
    call's first delta carries index, id, type and name and later ones only argument fragments."""
    content, calls, finish = "", {}, None
    for chunk in _chat(client, model, stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                if d.index not in calls:
                    assert d.id and d.type == "function" and d.function.name, d
                    calls[d.index] = [d.function.name, d.function.arguments or ""]
                else:
                    assert d.id is None and d.function.name is None, d
                    calls[d.index][1] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


@pytest.mark.parametrize("fixture", ["sdar", "llada2", "plain"])
def test_named_call_whole_and_streamed(request, fixture):
    model, client = request.getfixturevalue(fixture)
    choice = {"type": "function", "function": {"name": "paint"}}
    out = _chat(client, model, tools=TOOLS, tool_choice=choice).choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content is None
    (call,) = _validated(out.message.tool_calls)
    assert call[0] == "paint"
    content, calls, finish = _streamed(client, model, tools=TOOLS, tool_choice=choice)
    assert (content, calls, finish) == ("", [call], "tool_calls")


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_validate_and_stream_the_same(sdar, parallel):
    model, client = sdar
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, max_tokens=160)
    out = _chat(client, model, **kw).choices[0]
    calls = _validated(out.message.tool_calls)
    assert out.finish_reason == "tool_calls" and out.message.content is None
    assert len(calls) >= 1 and (parallel or len(calls) == 1)
    assert _streamed(client, model, **kw) == ("", calls, "tool_calls")


def test_several_choices_with_logprobs_stream_like_the_whole_reply(sdar):
    """``n`` = 2 with logprobs: each choice's streamed deltas reassemble to its whole calls."""
    model, client = sdar
    choice = {"type": "function", "function": {"name": "tag"}}
    kw = dict(tools=TOOLS, tool_choice=choice, n=2, logprobs=True, max_tokens=96)
    whole = _chat(client, model, **kw)
    calls = {c.index: _validated(c.message.tool_calls) for c in whole.choices}
    assert all(c.logprobs.content for c in whole.choices)
    got: dict[int, dict[int, list]] = {0: {}, 1: {}}
    for chunk in _chat(client, model, stream=True, **kw):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = got[c.index].setdefault(d.index, [d.function.name, ""])
                entry[1] += d.function.arguments or ""
    assert {i: [tuple(v) for v in got[i].values()] for i in got} == calls


def test_auto_is_the_default_and_answers_in_text(sdar):
    """A random model that writes no call marker answers in text: no tool_calls, finish stop/length."""
    model, client = sdar
    out = _chat(client, model, tools=TOOLS, max_tokens=24).choices[0]
    assert out.message.tool_calls is None and out.message.content
    assert TOOL_CALL not in out.message.content and out.finish_reason in ("stop", "length")
    content, calls, finish = _streamed(client, model, tools=TOOLS, max_tokens=24)
    assert (content, calls, finish) == (out.message.content, [], out.finish_reason)


def test_auto_call_once_the_trigger_appears(sdar):
    """A logit bias on ``<tool_call>`` makes the model open a call; from there the structural tag keeps
    the name and arguments within the tools; parallel_tool_calls false ends the reply after it."""
    model, client = sdar
    bias = {str(model.tokenizer.convert_tokens_to_ids(TOOL_CALL)): 100}
    kw = dict(tools=TOOLS, tool_choice="auto", parallel_tool_calls=False, logit_bias=bias, max_tokens=120)
    out = _chat(client, model, **kw).choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content is None
    (call,) = _validated(out.message.tool_calls)
    assert _streamed(client, model, **kw) == ("", [call], "tool_calls")


def test_sampled_calls_validate(sdar):
    """Sampling draws from the verifier's masked distribution: sampled calls match their schemas too."""
    model, client = sdar
    for seed in range(4):
        out = _chat(
            client, model, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=160
        )
        assert out.choices[0].finish_reason == "tool_calls"
        assert _validated(out.choices[0].message.tool_calls)


def test_none_answers_in_text(sdar):
    model, client = sdar
    out = _chat(client, model, tools=TOOLS, tool_choice="none", max_tokens=16).choices[0]
    assert out.message.tool_calls is None and isinstance(out.message.content, str)


@pytest.mark.parametrize("fixture", ["sdar", "llada2", "plain"])
def test_two_rounds_with_results_in_the_history(request, fixture):
    """call, result, call, result, then text: the history's calls and results render in the template."""
    model, client = request.getfixturevalue(fixture)
    messages = list(MESSAGES)
    for name in ("set_user", "tag"):
        choice = {"type": "function", "function": {"name": name}}
        msg = _chat(client, model, messages=messages, tools=TOOLS, tool_choice=choice).choices[0].message
        (call,) = _validated(msg.tool_calls)
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": f"ok {call[0]}"})
    final = _chat(client, model, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert isinstance(final.choices[0].message.content, str)
    prompt = final.usage.prompt_tokens
    assert prompt > _chat(client, model, tools=TOOLS, tool_choice="none", max_tokens=1).usage.prompt_tokens


BAD = [
    (
        {"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]},
        "tools.0.function.name",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "tools.0.function.parameters",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
        "tools.0.function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"name": "f"}]}, "tools.0.name"),
    ({"tools": ["f"]}, "tools.0"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools.0.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [*MESSAGES, {"role": "tool", "content": "42"}]}, "messages.1.tool_call_id"),
    (
        {
            "messages": [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {}}]},
            ]
        },
        "messages.1.tool_calls.0.function.name",
    ),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_bad_input_is_a_400_naming_the_field(sdar, extra, param):
    model, client = sdar
    body = {"messages": MESSAGES, **extra}
    messages = body.pop("messages")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model.name, messages=messages, max_tokens=4, extra_body=body)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param, err.value.body

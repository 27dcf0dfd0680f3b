"""Tool calling as agent frameworks drive it, through the official ``openai`` client against a real server
on 127.0.0.1 (the random SDAR model with the Hermes template, tests/tool_fixtures.py): ``response_format``
together with ``tools`` (calls or a schema-valid answer), replies cut inside a call by ``max_tokens`` or a
stop string (every complete call kept, no markup in the content, finish ``length``, usage counting every
token), streamed == whole on every finish, ``n`` > 1 under ``required``, and unknown nested keys as a 400
naming their path (chat and Responses)."""

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
from structured_fixtures import EOS, SCHEMAS  # noqa: E402
from tool_fixtures import TOOL_CALL, make_sdar_tool_model  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "tag", "parameters": SCHEMAS["array"]}},
    {"type": "function", "function": {"name": "paint", "parameters": SCHEMAS["enum"]}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ANSWER = SCHEMAS["nested"]
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
MESSAGES = [{"role": "user", "content": "user ab 3"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("agents")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=10, max_queue=64)) as base:
        yield model, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)


def _chat(served, **kw):
    model, client = served
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("tools", TOOLS)
    extra = {"s2d2": {"preset": "lossless"}, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=model.name, extra_body=extra, **kw)


def _calls(message):
    out = []
    for call in message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), BY_NAME[call.function.name])
        out.append((call.function.name, call.function.arguments))
    return out


def test_format_with_tools_gives_calls_or_a_schema_valid_answer(served):
    """20 sampled replies (half with a bias toward ``{``, the answer's first character): each is valid
    calls or an answer meeting the schema, and both occur."""
    model, _ = served
    brace = str(model.tokenizer.convert_tokens_to_ids("{"))
    kinds = []
    for bias in ({}, {brace: 8.0}):
        kw = dict(response_format=FORMAT, n=10, temperature=1.0, seed=7, max_tokens=160, logit_bias=bias)
        for choice in _chat(served, **kw).choices:
            if choice.message.tool_calls:
                assert _calls(choice.message) and not choice.message.content
                kinds.append("calls" if choice.finish_reason == "tool_calls" else "cut calls")
            else:
                jsonschema.validate(json.loads(choice.message.content), ANSWER)
                kinds.append("answer")
    print({k: kinds.count(k) for k in set(kinds)})
    assert len(kinds) == 20 and "answer" in kinds and "calls" in kinds


def test_format_with_tools_lossless_equals_constrained_ar(served):
    """Greedy under the combined constraint: the lossless preset's tokens equal constrained AR's."""
    kw = dict(response_format=FORMAT, max_tokens=120, logprobs=True)
    lossless = _chat(served, **kw).choices[0]
    ar = _chat(served, **kw, extra_body={"s2d2": {"decoder": "ar", "causal_cache": True}}).choices[0]
    assert [t.token for t in lossless.logprobs.content] == [t.token for t in ar.logprobs.content]
    assert (lossless.message.content, _calls(lossless.message)) == (ar.message.content, _calls(ar.message))


def test_required_replies_cut_by_max_tokens_keep_every_complete_call(served):
    """10 sampled required replies with parallel calls (a bias against EOS keeps them calling), each cut
    by max_tokens: the reply's raw text (its tokens from logprobs) holds as many complete calls as
    ``tool_calls`` (the cut one dropped), the content has no markup, the finish is length; the usage counts
    every token."""
    model, _ = served
    no_end = {str(model.tokenizer.convert_tokens_to_ids(EOS)): -100.0}  # calls go on until the limit
    kw = dict(tool_choice="required", n=10, temperature=1.0, seed=3, max_tokens=150, logprobs=True)
    out = _chat(served, **kw, logit_bias=no_end)
    complete = []
    for choice in out.choices:
        raw = "".join(t.token for t in choice.logprobs.content)
        calls = _calls(choice.message)
        assert TOOL_CALL not in (choice.message.content or "")
        assert len(calls) == raw.count("</tool_call>")
        assert choice.finish_reason == "length" and not raw.endswith("</tool_call>")
        complete.append(len(calls))
    assert out.usage.completion_tokens == sum(len(c.logprobs.content) for c in out.choices)
    print("complete calls per cut reply:", complete)
    assert len(complete) == 10 and sum(complete) > 0


def test_a_stop_string_inside_a_call_drops_it(served):
    out = _chat(served, tool_choice="required", stop=['"arguments": '], max_tokens=60).choices[0]
    assert (out.message.content or "", out.message.tool_calls, out.finish_reason) == ("", None, "length")


def _streamed(served, **kw):
    """Per choice: content, calls reassembled from the deltas, finish reason."""
    got: dict[int, list] = {}
    for chunk in _chat(served, stream=True, **kw):
        for c in chunk.choices:
            entry = got.setdefault(c.index, ["", {}, None])
            entry[0] += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                call = entry[1].setdefault(d.index, [d.function.name, ""])
                call[1] += d.function.arguments or ""
            entry[2] = c.finish_reason or entry[2]
    return {i: (v[0], [tuple(c) for c in v[1].values()], v[2]) for i, v in got.items()}


@pytest.mark.parametrize(("parallel", "max_tokens"), [(True, 100), (False, 200)], ids=["cut", "whole"])
def test_streamed_equals_whole_on_every_finish(served, parallel, max_tokens):
    """8 sampled pairs each: cut inside a call (parallel calls that never end: finish length) and not (one
    call: finish tool_calls)."""
    model, _ = served
    kw = dict(tool_choice="required", parallel_tool_calls=parallel, n=8, temperature=1.0, seed=11)
    kw["max_tokens"] = max_tokens
    if parallel:
        kw["logit_bias"] = {str(model.tokenizer.convert_tokens_to_ids(EOS)): -100.0}
    whole = {
        c.index: (c.message.content or "", _calls(c.message), c.finish_reason)
        for c in _chat(served, **kw).choices
    }
    assert _streamed(served, **kw) == whole
    finishes = {w[2] for w in whole.values()}
    assert finishes == ({"length"} if parallel else {"tool_calls"}), whole


def test_several_choices_all_call_under_required(served):
    out = _chat(served, tool_choice="required", parallel_tool_calls=False, n=2, temperature=1.0, seed=5)
    assert [c.finish_reason for c in out.choices] == ["tool_calls", "tool_calls"]
    assert all(len(_calls(c.message)) == 1 for c in out.choices)


CALL = {"id": "c1", "type": "function", "function": {"name": "tag", "arguments": "{}"}}
CHAT_BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "tag"}, "foo": 1}}, "tool_choice.foo"),
    (
        {"tool_choice": {"type": "function", "function": {"name": "tag", "foo": 1}}},
        "tool_choice.function.foo",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]},
        "messages.0.content.0.foo",
    ),
    (
        {"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{**CALL, "foo": 1}]}]},
        "messages.1.tool_calls.0.foo",
    ),
    (
        {
            "messages": [
                *MESSAGES,
                {
                    "role": "assistant",
                    "tool_calls": [{**CALL, "function": {"name": "tag", "arguments": "{}", "foo": 1}}],
                },
            ]
        },
        "messages.1.tool_calls.0.function.foo",
    ),
]


@pytest.mark.parametrize(("extra", "param"), CHAT_BAD, ids=[p for _, p in CHAT_BAD])
def test_unknown_nested_keys_in_chat_are_a_400_naming_them(served, extra, param):
    model, client = served
    body = {"messages": MESSAGES, "tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model.name, messages=body.pop("messages"), max_tokens=4, extra_body=body
        )
    assert err.value.body["param"] == param and param in err.value.body["message"], err.value.body


FLAT_TOOLS = [{"type": "function", "name": "tag", "parameters": SCHEMAS["array"]}]
SCHEMA_FORMAT = {"type": "json_schema", "name": "answer", "schema": ANSWER}
RESPONSES_BAD = [
    ({"input": [{"role": "user", "content": "hi", "foo": 1}]}, "input.0.foo"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "foo": 1}]}]},
        "input.0.content.0.foo",
    ),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1", "foo": 1}]}, "input.0.foo"),
    ({"text": {"format": {**SCHEMA_FORMAT, "foo": 1}}}, "text.format.foo"),
    ({"text": {"format": SCHEMA_FORMAT, "foo": 1}}, "text.foo"),
    ({"tool_choice": {"type": "function", "name": "tag", "foo": 1}}, "tool_choice.foo"),
]


@pytest.mark.parametrize(("extra", "param"), RESPONSES_BAD, ids=[p for _, p in RESPONSES_BAD])
def test_unknown_nested_keys_in_responses_are_a_400_naming_them(served, extra, param):
    model, client = served
    body = {"input": "hi", "tools": FLAT_TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model=model.name, input=body.pop("input"), max_output_tokens=4, extra_body=body
        )
    assert err.value.body["param"] == param and param in err.value.body["message"], err.value.body


def test_responses_reasoning_items_sent_back_are_accepted(served):
    """A reasoning item in the input (as a client sends it back) joins the next assistant turn."""
    model, client = served
    items = [
        {"role": "user", "content": "user ab 3"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "t"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "tag", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    out = client.responses.create(model=model.name, input=items, tools=FLAT_TOOLS, max_output_tokens=4)
    assert out.status in ("completed", "incomplete")


def test_responses_text_format_with_tools_gives_calls_or_a_valid_answer(served):
    """The Agents SDK's ``output_type`` with tools on the Responses API: ``text.format`` + ``tools`` is a
    200 whose output is function calls or a message meeting the schema (a bias toward ``{`` gives the
    answer)."""
    model, client = served
    brace = str(model.tokenizer.convert_tokens_to_ids("{"))
    kinds = set()
    for bias in ({}, {brace: 20.0}):
        out = client.responses.create(
            model=model.name,
            input="user ab 3",
            tools=FLAT_TOOLS,
            text={"format": SCHEMA_FORMAT},
            max_output_tokens=160,
            extra_body={"s2d2": {"preset": "lossless", "logit_bias": bias}},
        )
        types = [o.type for o in out.output]
        if types[0] == "function_call":
            assert set(types) == {"function_call"}
            kinds.add("calls")
        else:
            assert types == ["message"]
            jsonschema.validate(json.loads(out.output_text), ANSWER)
            kinds.add("answer")
    assert kinds == {"calls", "answer"}

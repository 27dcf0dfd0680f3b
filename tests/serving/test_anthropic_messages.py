"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) through the official
``anthropic`` SDK against a real server on 127.0.0.1 (the random SDAR model with the Hermes template,
tests/tool_fixtures.py): text equal to chat completions, streamed events the SDK assembles into the
whole message, a tool round trip (``tool_use`` / ``tool_result`` blocks), stop sequences, sampling
fields, ``count_tokens`` equal to the chat template's rendering, errors in Anthropic's shape naming the
field's path, and the API key sent as ``x-api-key``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from structured_fixtures import EOS, SCHEMAS  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

TOOLS = [
    {"name": "paint", "description": "Paint it.", "input_schema": SCHEMAS["enum"]},
    {"name": "tag", "input_schema": SCHEMAS["array"]},
]
LOSSLESS = {"s2d2": {"preset": "lossless"}}
SYSTEM = "Be brief."
USER = [{"role": "user", "content": "user ab 3"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("messages")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4, api_key="sk-test")) as base:
        client = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0, timeout=120)
        yield model, client, base


def _create(served, **kw):
    model, client, _ = served
    kw.setdefault("extra_body", LOSSLESS)
    kw.setdefault("messages", USER)
    return client.messages.create(model=model.name, **kw)


def _stream(served, **kw):
    """The raw events' types, the text and JSON deltas, and the SDK's assembled final message."""
    model, client, _ = served
    kw.setdefault("extra_body", LOSSLESS)
    kw.setdefault("messages", USER)
    types, text, args = [], "", ""
    with client.messages.stream(model=model.name, **kw) as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                args += event.delta.partial_json
        final = stream.get_final_message()
    return types, text, args, final


def _blocks(content):
    """Content blocks as plain dicts (the SDK's streamed and whole block classes differ)."""
    keep = {"type", "text", "id", "name", "input"}
    return [{k: v for k, v in b.model_dump().items() if k in keep} for b in content]


def _chat(served, **kw):
    model, _, base = served
    chat = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    return chat.chat.completions.create(model=model.name, extra_body=LOSSLESS, **kw)


def test_text_equals_chat_streamed_and_not(served):
    out = _create(served, system=SYSTEM, max_tokens=12)
    messages = [{"role": "system", "content": SYSTEM}, *USER]
    chat = _chat(served, messages=messages, max_tokens=12)
    want = chat.choices[0].message.content
    assert [b.type for b in out.content] == (["text"] if want else [])
    assert "".join(b.text for b in out.content) == want
    finish = chat.choices[0].finish_reason
    assert out.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[finish]
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert out.usage.output_tokens == chat.usage.completion_tokens
    assert out.role == "assistant" and out.type == "message" and out.id.startswith("msg_")
    types, text, _, final = _stream(served, system=SYSTEM, max_tokens=12)
    assert types[:2] == ["message_start", "content_block_start"] and types[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert text == want and _blocks(final.content) == _blocks(out.content)
    assert (final.stop_reason, final.usage.output_tokens) == (out.stop_reason, out.usage.output_tokens)


def test_raw_event_sequence(served):
    """Every event is ``event: T`` with a JSON ``data`` of type T, in Anthropic's order, with a ping."""
    model, _, base = served
    body = {"model": model.name, "max_tokens": 8, "messages": USER, "stream": True, **LOSSLESS}
    answer = httpx.post(base + "/v1/messages", json=body, headers={"x-api-key": "sk-test"}, timeout=120)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    events = [e for e in answer.text.split("\n\n") if e.strip()]
    kinds = []
    for e in events:
        head, data = e.split("\n")
        kinds.append(head.removeprefix("event: "))
        assert json.loads(data.removeprefix("data: "))["type"] == kinds[-1]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    middle = kinds[2:-2]
    assert middle[0] == "content_block_start" and middle[-1] == "content_block_stop"
    assert set(middle[1:-1]) == {"content_block_delta"}


def test_tool_round_trip_streamed_and_not(served):
    kw = dict(tools=TOOLS, tool_choice={"type": "tool", "name": "paint"}, max_tokens=80)
    out = _create(served, **kw)
    (call,) = out.content
    assert call.type == "tool_use" and call.name == "paint" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, SCHEMAS["enum"])
    assert out.stop_reason == "tool_use"
    types, _, args, final = _stream(served, **kw)
    (streamed,) = final.content
    assert (streamed.type, streamed.name, streamed.input) == ("tool_use", "paint", call.input)
    assert json.loads(args) == call.input and final.stop_reason == "tool_use"
    follow = [
        *USER,
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "done"}]},
    ]
    again = _create(
        served, messages=follow, tools=TOOLS, tool_choice={"type": "tool", "name": "tag"}, max_tokens=80
    )
    (second,) = again.content
    assert second.name == "tag"
    jsonschema.validate(second.input, SCHEMAS["array"])
    closing = _create(served, messages=follow, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=6)
    assert all(b.type == "text" for b in closing.content) and closing.stop_reason in (
        "end_turn",
        "max_tokens",
    )


def test_any_without_parallel_calls_makes_one_valid_call(served):
    choice = {"type": "any", "disable_parallel_tool_use": True}
    out = _create(served, tools=TOOLS, tool_choice=choice, max_tokens=96)
    calls = [b for b in out.content if b.type == "tool_use"]
    assert len(calls) == 1 and out.stop_reason == "tool_use"
    jsonschema.validate(calls[0].input, SCHEMAS["enum" if calls[0].name == "paint" else "array"])


@pytest.mark.parametrize("limit, calls", [(24, 0), (100, 1), (120, 1), (160, 1)])
def test_parallel_calls_cut_by_max_tokens_streamed_equal_whole(served, limit, calls):
    """Under ``any`` with parallel calls, EOS biased off (but at 160), a reply ends inside a call: its
    complete calls are kept (at least ``calls``), the cut one dropped (no markup in a text block), and
    the stream gives the same blocks and stop."""
    model = served[0]
    settings = dict(LOSSLESS["s2d2"])
    if limit != 160:
        settings["logit_bias"] = {str(model.tokenizer.convert_tokens_to_ids(EOS)): -100.0}
    kw = dict(tools=TOOLS, tool_choice={"type": "any"}, max_tokens=limit, extra_body={"s2d2": settings})
    out = _create(served, **kw)
    assert all(b.type == "tool_use" for b in out.content) and len(out.content) >= calls, out.content
    for b in out.content:
        jsonschema.validate(b.input, SCHEMAS["enum" if b.name == "paint" else "array"])
    assert out.stop_reason == ("tool_use" if limit == 160 else "max_tokens")
    _, text, _, final = _stream(served, **kw)

    def shown(content):
        return [{k: v for k, v in b.items() if k != "id"} for b in _blocks(content)]

    assert shown(final.content) == shown(out.content)
    assert text == "" and final.stop_reason == out.stop_reason


def test_stop_sequences(served):
    free = _create(served, max_tokens=24)
    text = free.content[0].text
    stop = text[3:5]
    cut = _create(served, max_tokens=24, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert "".join(b.text for b in cut.content) == text[: text.index(stop)]
    assert cut.usage.output_tokens <= free.usage.output_tokens
    types, streamed, _, final = _stream(served, max_tokens=24, stop_sequences=[stop])
    assert streamed == text[: text.index(stop)] and final.stop_sequence == stop


def test_sampling_fields_are_honoured(served):
    greedy = _create(served, max_tokens=16, extra_body={**LOSSLESS, "temperature": 0})
    top1 = _create(
        served, max_tokens=16, extra_body={**LOSSLESS, "temperature": 1.0, "top_k": 1, "top_p": 0.5}
    )
    assert top1.content == greedy.content  # top_k 1 keeps only the most likely token
    hot = _create(
        served, max_tokens=16, extra_body={"s2d2": {"preset": "lossless", "seed": 3}, "temperature": 1.0}
    )
    assert hot.content != greedy.content  # temperature 1 samples (a random model's text differs)


def test_output_config_format_json_schema(served):
    fmt = {"type": "json_schema", "schema": SCHEMAS["nested"]}
    out = _create(served, max_tokens=64, extra_body={**LOSSLESS, "output_config": {"format": fmt}})
    jsonschema.validate(json.loads(out.content[0].text), SCHEMAS["nested"])
    assert out.stop_reason == "end_turn"


def test_count_tokens_equals_the_rendered_prompt(served):
    model, client, _ = served
    conv = [{"role": "system", "content": SYSTEM}, *USER]
    chat_tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS
    ]
    chat_tools[0]["function"]["description"] = "Paint it."
    tok = model.tokenizer
    want = len(
        tok.apply_chat_template(
            conv, tools=chat_tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    counted = client.messages.count_tokens(model=model.name, system=SYSTEM, messages=USER, tools=TOOLS)
    assert counted.input_tokens == want
    plain = len(tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False))
    none = client.messages.count_tokens(
        model=model.name, system=SYSTEM, messages=USER, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert none.input_tokens == plain < want
    out = _create(
        served, system=SYSTEM, tools=TOOLS, tool_choice={"type": "tool", "name": "paint"}, max_tokens=80
    )
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == want


@pytest.mark.parametrize(
    "extra, path",
    [
        ({"foo": 1}, "foo"),
        ({"container": "c"}, "container"),
        ({"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages.0.foo"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
            "messages.0.content.0.x",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Su"}]},
            "messages.1",
        ),
        ({"system": [{"type": "text", "text": "s", "y": 2}]}, "system.0.y"),
        ({"tools": [{**TOOLS[0], "bar": 1}]}, "tools.0.bar"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": TOOLS, "tool_choice": {"type": "auto", "baz": 1}}, "tool_choice.baz"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"max_tokens": "many"}, "max_tokens"),
    ],
)
def test_bad_requests_are_anthropic_errors_naming_the_path(served, extra, path):
    model, client, _ = served
    body = {"model": model.name, "max_tokens": 8, "messages": USER, **extra}
    with pytest.raises(anthropic.BadRequestError) as err:
        client.post("/v1/messages", body=body, cast_to=object)
    assert err.value.status_code == 400
    payload = err.value.body
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert path in payload["error"]["message"], payload


def test_other_errors_keep_anthropic_shape(served):
    model, client, base = served
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-nope", max_tokens=8, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as err:
        client.post("/v1/messages", body={"model": model.name, "messages": USER}, cast_to=object)
    assert "max_tokens" in err.value.body["error"]["message"]
    denied = httpx.post(base + "/v1/messages", json={"model": model.name, "max_tokens": 8, "messages": USER})
    assert denied.status_code == 401
    assert denied.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": denied.json()["error"]["message"]},
    }
    wrong = httpx.post(base + "/v1/messages/count_tokens", json={}, headers={"x-api-key": "sk-wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    chat = httpx.post(
        base + "/v1/chat/completions", json={"messages": USER}, headers={"x-api-key": "sk-test"}
    )
    assert chat.status_code == 200 and "error" not in chat.json()

"""``POST /v1/responses`` (issue 61) through the official client's ``client.responses.create`` against a
real server on 127.0.0.1 (the random SDAR model with the Hermes template, tests/tool_fixtures.py):
text input, instructions, a function-call round trip (``function_call`` / ``function_call_output``
items), ``text.format`` json_schema, streamed events that add up to the whole response, and refused
fields as a 400 naming them."""

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
from tool_fixtures import make_sdar_tool_model  # noqa: E402

TOOLS = [
    {"type": "function", "name": "paint", "parameters": SCHEMAS["enum"]},
    {"type": "function", "name": "tag", "description": "Tag it.", "parameters": SCHEMAS["array"]},
]
LOSSLESS = {"s2d2": {"preset": "lossless"}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("responses")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4)) as base:
        yield model, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def _create(served, **kw):
    model, client = served
    kw.setdefault("extra_body", LOSSLESS)
    return client.responses.create(model=model.name, **kw)


def _stream(served, **kw):
    """The streamed events' types and the final response."""
    types, final, text, args = [], None, "", ""
    for event in _create(served, stream=True, **kw):
        types.append(event.type)
        text += event.delta if event.type == "response.output_text.delta" else ""
        args += event.delta if event.type == "response.function_call_arguments.delta" else ""
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    return types, final, text, args


def test_text_input_and_instructions_equal_chat(served):
    model, client = served
    out = _create(served, input="user ab 3", instructions="Be brief.", max_output_tokens=12)
    chat = client.chat.completions.create(
        model=model.name,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "user ab 3"}],
        max_tokens=12,
        extra_body=LOSSLESS,
    )
    assert out.output_text == chat.choices[0].message.content
    assert out.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    types, final, text, _ = _stream(served, input="user ab 3", instructions="Be brief.", max_output_tokens=12)
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types and "response.output_text.done" in types
    assert text == final.output_text == out.output_text


def test_function_call_round_trip_streamed_and_not(served):
    choice = {"type": "function", "name": "paint"}
    kw = dict(input="paint it", tools=TOOLS, tool_choice=choice, max_output_tokens=80)
    out = _create(served, **kw)
    (call,) = out.output
    assert call.type == "function_call" and call.name == "paint" and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["enum"])
    types, final, _, args = _stream(served, **kw)
    assert (
        "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    )
    (streamed,) = final.output
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments) and args == call.arguments
    follow = [
        {"role": "user", "content": "paint it"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "done"},
    ]
    again = _create(
        served,
        input=follow,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "tag"},
        max_output_tokens=80,
    )
    (second,) = again.output
    jsonschema.validate(json.loads(second.arguments), SCHEMAS["array"])
    final_text = _create(served, input=follow, tools=TOOLS, tool_choice="none", max_output_tokens=6)
    assert final_text.output[0].type == "message" and all(o.type == "message" for o in final_text.output)


def test_text_format_json_schema(served):
    fmt = {"type": "json_schema", "name": "user", "schema": SCHEMAS["nested"]}
    out = _create(served, input="user ab 3", text={"format": fmt}, max_output_tokens=64)
    jsonschema.validate(json.loads(out.output_text), SCHEMAS["nested"])


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "parameters": {"type": "object"}}]}, "tools.0.name"),
        ({"input": [{"type": "file_search_call", "id": "fs_1"}]}, "input.0.type"),
        ({"max_output_tokens": 100000}, "max_output_tokens"),
    ],
)
def test_refused_fields_are_a_400_naming_them(served, extra, param):
    model, client = served
    body = {"input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/responses", body={"model": model.name, **body}, cast_to=object)
    assert err.value.body["param"] == param, err.value.body

"""Structured output on the server (issue 51), through the official ``openai`` client against a real
server on 127.0.0.1: ``response_format`` json_schema (whole and streamed), vLLM's extras (tool calls:
test_tool_calls.py), and a bad schema or a ``tool_choice`` naming no tool as a 400 naming the field."""

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
from structured_fixtures import SCHEMAS, make_json_model  # noqa: E402

SCHEMA = SCHEMAS["nested"]
MESSAGES = [{"role": "user", "content": "user ab 3"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return s2d2.load(make_json_model(tmp_path_factory.mktemp("json_server")), device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def client(model):
    with running_server(create_app(model, max_num_seqs=8, max_queue=32)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)


def _format(schema):
    return {"type": "json_schema", "json_schema": {"name": "user", "schema": schema}}


def test_json_schema_equals_the_api_and_streams_the_same_text(model, client):
    settings = {"preset": "lossless"}
    want = model.generate("user ab 3", json_schema=SCHEMA, max_new_tokens=64, **settings)
    jsonschema.validate(json.loads(want.text), SCHEMA)
    out = client.completions.create(
        model=model.name,
        prompt="user ab 3",
        max_tokens=64,
        extra_body={"s2d2": settings, "response_format": _format(SCHEMA)},
    )
    assert out.choices[0].text == want.text
    whole = client.chat.completions.create(
        model=model.name,
        messages=MESSAGES,
        max_tokens=64,
        response_format=_format(SCHEMA),
        extra_body={"s2d2": settings},
    )
    text = whole.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    stream = client.chat.completions.create(
        model=model.name,
        messages=MESSAGES,
        max_tokens=64,
        response_format=_format(SCHEMA),
        stream=True,
        extra_body={"s2d2": settings},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": SCHEMAS["enum"]},
        {"structured_outputs": {"json": SCHEMAS["enum"]}},
    ],
)
def test_vllm_extras(model, client, extra):
    out = client.completions.create(model=model.name, prompt="color", max_tokens=48, extra_body=extra)
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMAS["enum"])


def test_guided_choice_and_regex(model, client):
    out = client.completions.create(
        model=model.name, prompt="x", max_tokens=8, extra_body={"guided_choice": ["red", "blue"]}
    )
    assert out.choices[0].text in ("red", "blue")
    out = client.completions.create(
        model=model.name, prompt="x", max_tokens=12, extra_body={"structured_outputs": {"regex": "[0-9]{3}"}}
    )
    assert len(out.choices[0].text) == 3 and out.choices[0].text.isdigit()


@pytest.mark.parametrize(
    "extra, param, words",
    [
        (
            {"response_format": _format({"type": "object", "properties": {"a": {"type": "nonsense"}}})},
            "response_format",
            "nonsense",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        ({"guided_regex": "([a"}, "guided_regex", "regex"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
            "'g'",
        ),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_field(model, client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=8, extra_body=extra)
    err = exc.value.body
    assert err["param"] == param, err
    assert words in err["message"] and "\n" not in err["message"]

"""OpenAI's and vLLM's request fields beyond the core ones (issue 60; serving/openai_fields.py): vLLM's
``min_p``, ``repetition_penalty``, ``include_stop_str_in_output``, ``skip_special_tokens`` and
``chat_template_kwargs`` honoured; OpenAI's no-op fields accepted and changing nothing; OpenAI's other
documented fields refused as ``unsupported_parameter``; unknown keys inside nested objects a 400 naming
their path. Real HTTP with the official ``openai`` client."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402

Q = "Ben has 3 apples. He buys 2 more. How many apples does Ben have?"
CHAT = [{"role": "user", "content": Q}]


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=4)


@pytest.fixture(scope="module")
def client(model):
    with running_server(create_app(model, max_num_seqs=4)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)


def _text(client, **extra):
    out = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16, extra_body=extra)
    return out.choices[0].text


def test_min_p_and_repetition_penalty_equal_the_python_api(model, client):
    for settings in [{"min_p": 0.5, "temperature": 1.0, "seed": 4}, {"repetition_penalty": 1.9}]:
        want = model.generate(Q, max_new_tokens=16, **settings).text
        assert _text(client, **settings) == want
    with pytest.raises(openai.BadRequestError) as err:
        _text(client, min_p=1.5)
    assert err.value.body["param"] == "min_p"


def test_include_stop_str_in_output_keeps_the_stop_string(client):
    plain = _text(client)
    assert "=" in plain
    cut = _text(client, stop=["="])
    kept = _text(client, stop=["="], include_stop_str_in_output=True)
    assert cut == plain[: plain.index("=")] and kept == cut + "="
    streamed = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=16, stream=True, stop=["="],
        extra_body={"include_stop_str_in_output": True},
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed if c.choices) == kept


def test_skip_special_tokens_false_writes_special_tokens(client):
    unk = {"3": 100}  # <unk>, a special token, made the only likely one
    out = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=3, logit_bias=unk)
    assert "<unk>" not in out.choices[0].text
    raw = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=3, logit_bias=unk, extra_body={"skip_special_tokens": False}
    )
    assert raw.choices[0].text.count("<unk>") == 3


def test_chat_template_kwargs_must_be_an_object(client):
    plain = client.chat.completions.create(model="tiny-gsm", messages=CHAT, max_tokens=8)
    same = client.chat.completions.create(
        model="tiny-gsm", messages=CHAT, max_tokens=8, extra_body={"chat_template_kwargs": {"x": 1}}
    )  # (the built-in model has no chat template: the fallback takes no variables)
    assert same.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-gsm", messages=CHAT, max_tokens=8, extra_body={"chat_template_kwargs": 3}
        )
    assert err.value.body["param"] == "chat_template_kwargs"


NO_OPS = {
    "parallel_tool_calls": True,
    "prompt_cache_key": "k1",
    "safety_identifier": "u-1",
    "verbosity": "low",
    "prediction": None,
    "audio": None,
    "modalities": ["text"],
}


def test_documented_no_op_fields_are_accepted_and_change_nothing(client):
    plain = client.chat.completions.create(model="tiny-gsm", messages=CHAT, max_tokens=12)
    tagged = client.chat.completions.create(model="tiny-gsm", messages=CHAT, max_tokens=12, extra_body=NO_OPS)
    assert tagged.choices[0].message.content == plain.choices[0].message.content
    assert _text(client, **NO_OPS) == _text(client)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_unsupported_documented_fields_are_refused_as_such(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-gsm", messages=CHAT, max_tokens=4, extra_body=extra)
    body = err.value.body
    assert body["code"] == "unsupported_parameter" and body["param"] == param
    assert "is not supported" in body["message"]


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"messages": [{"role": "user", "content": Q, "colour": "red"}]}, "messages.0.colour"),
        ({"response_format": {"type": "json_object", "strictness": 1}}, "response_format.strictness"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}}},
            "response_format.json_schema.x",
        ),
        ({"stream": True, "stream_options": {"include_usage": True, "y": 1}}, "stream_options.y"),
        ({"tools": [{"type": "function", "function": {"name": "f"}, "z": 1}]}, "tools.0.z"),
        ({"tools": [{"type": "function", "function": {"name": "f", "w": 2}}]}, "tools.0.function.w"),
    ],
)
def test_unknown_nested_keys_are_a_400_naming_their_path(client, kwargs, param):
    body = {"messages": CHAT, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/chat/completions", body={"model": "tiny-gsm", "max_tokens": 4, **body}, cast_to=object)
    assert err.value.body["param"] == param and err.value.body["code"] == "unknown_parameter"


def test_a_json_body_without_a_json_content_type_is_told_what_is_wrong(client):
    import httpx

    url = str(client.base_url).rstrip("/") + "/completions"
    body = '{"prompt": "hi", "max_tokens": 2}'
    for headers in [{"content-type": "text/plain"}, {}]:
        resp = httpx.post(url, content=body, headers=headers, timeout=30)
        err = resp.json()["error"]
        assert resp.status_code == 400 and err["code"] == "invalid_content_type"
        assert "Content-Type: application/json" in err["message"]
    ok = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert ok.status_code == 200


def test_a_prompt_with_unknown_words_gets_a_note(client):
    plain = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=4, echo=True, logprobs=0)
    assert not any("unknown token" in n for n in plain.model_extra["s2d2"]["notes"])
    odd = client.completions.create(
        model="tiny-gsm", prompt="Ben has 3 zebras.", max_tokens=4, echo=True, logprobs=0
    )
    assert any("unknown token" in n and "text_offset" in n for n in odd.model_extra["s2d2"]["notes"])


def test_eos_renders_alike_at_every_position(client):
    """``ignore_eos`` with ``skip_special_tokens: false``: every EOS is text, the last one too, streamed
    and not; a request that stops on EOS still leaves its stop out of the text."""
    eos = {"1": 100}
    extra = {"skip_special_tokens": False, "s2d2": {"ignore_eos": True}}
    kw = dict(model="tiny-gsm", prompt=Q, max_tokens=3, logit_bias=eos, extra_body=extra)
    out = client.completions.create(**kw)
    assert out.choices[0].text == "<eos> <eos> <eos>"
    streamed = client.completions.create(**kw, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == out.choices[0].text
    stopped = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=3, logit_bias=eos, extra_body={"skip_special_tokens": False}
    )
    assert stopped.choices[0].text == "" and stopped.choices[0].finish_reason == "stop"


def test_models_give_max_model_len_and_the_block_size(client, model):
    listed = client.models.list().data[0].model_dump()
    one = client.models.retrieve("tiny-gsm").model_dump()
    for card in (listed, one):
        assert card["max_model_len"] == model.info.max_length > 0
        assert card["s2d2"]["block_size"] == model.make_config().block_size

"""``s2d2 serve`` over a tiny model built on SDAR-4B-Chat's published tokenizer, chat template and generation
config (:mod:`published_model`): a real server process on 127.0.0.1 and the official ``openai`` client.
Chats stop at the template's end of turn, tools render through the published template and a call parses,
``enable_thinking`` reaches the template, the mask token's text is ordinary text and its id is refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("xgrammar")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from test_server import free_port, start_server  # noqa: E402

from published_model import published_sdar_model, published_side_file  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
HI = [{"role": "user", "content": "Hi"}]


def _added(text: str) -> int:
    """The id the published tokenizer gives the added token ``text``."""
    decoder = published_side_file("tokenizer_config.json")["added_tokens_decoder"]
    return next(int(k) for k, v in decoder.items() if v["content"] == text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = published_sdar_model(tmp_path_factory.mktemp("published_sdar"))
    port = free_port()
    # (a vocabulary of 152k tokens loads slower than the test tokenizers)
    args = ("--model", str(path), "--device", "cpu", "--dtype", "fp32", "--served-name", "x")
    proc = start_server(port, *args, wait=240.0)
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    finally:
        proc.terminate()
        proc.wait(60)


def test_models_show_the_generation_defaults(server):
    _, client = server
    [card] = client.models.list().data
    gen = published_side_file("generation_config.json")
    assert card.generation_defaults == {k: gen[k] for k in ("temperature", "top_k", "top_p")}


def test_a_chat_stops_at_the_end_of_turn(server):
    _, client = server
    end = _added("<|im_end|>")
    assert end != published_side_file("config.json")["eos_token_id"]  # only the generation config names it
    out = client.chat.completions.create(model="x", messages=HI, max_tokens=12, logit_bias={str(end): 100})
    choice = out.choices[0]
    assert (choice.finish_reason, choice.message.content, out.usage.completion_tokens) == ("stop", "", 1)


def test_tools_render_through_the_published_template_and_a_call_parses(server):
    _, client = server
    plain = client.chat.completions.create(model="x", messages=HI, max_tokens=1)
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(
        model="x", messages=HI, tools=[WEATHER], tool_choice=named, max_tokens=48, temperature=0,
        # thinking off: the call is constrained from the first token (with thinking on, a think block
        # may come first and the random model would spend the whole limit on it)
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert out.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the template wrote the tools
    [call] = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}


def test_enable_thinking_reaches_the_template(server):
    _, client = server

    def prompt_tokens(**kwargs) -> int:
        body = {"chat_template_kwargs": kwargs} if kwargs else None
        return client.chat.completions.create(
            model="x", messages=HI, max_tokens=1, extra_body=body
        ).usage.prompt_tokens

    on = prompt_tokens()
    assert prompt_tokens(enable_thinking=True) == on
    assert prompt_tokens(enable_thinking=False) > on  # the template writes an empty think block


def test_mask_text_is_ordinary_text_and_mask_ids_are_refused(server):
    base, client = server
    mask = _added("<|MASK|>")
    text = "a <|MASK|> b"
    ok = httpx.post(f"{base}/v1/completions", json={"prompt": text, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] > 3
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 2},
        timeout=60,
    )
    assert chat.status_code == 200
    bad = httpx.post(f"{base}/v1/completions", json={"prompt": [64, mask, 293], "max_tokens": 2}, timeout=60)
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error" and f"mask token (id {mask})" in error["message"]

"""Reasoning on the server, through the official ``openai`` client against real servers on 127.0.0.1:
a random model with the published SDAR (Qwen3-style) chat template gets the ``qwen3`` parser by default;
its ``<think>`` block is split into ``reasoning_content`` on the whole message and on the stream's deltas
(the same text), into a ``reasoning`` item on the Responses API; ``chat_template_kwargs.enable_thinking``
reaches the template; ``--reasoning-parser none`` leaves the text whole; LLaDA2's template gets no
parser. A regex constraint makes the random model write a think block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from reasoning_fixtures import make_thinking_model  # noqa: E402
from s2d2.errors import S2D2Error  # noqa: E402
from s2d2.serving.app import create_app, resolve_reasoning_parser  # noqa: E402
from tool_fixtures import LLADA2_TEMPLATE  # noqa: E402

MESSAGES = [{"role": "user", "content": "user ab 3"}]
#: the reply the regex allows: a think block, then a short answer
THINKING = {"regex": "<think>\n[a-z]{2,6}( [a-z]{2,6}){1,3}\n</think>\n\n[a-z]{2,6}( [a-z]{2,6}){0,2}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return s2d2.load(make_thinking_model(tmp_path_factory.mktemp("thinking")), device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def client(model):
    with running_server(create_app(model, max_num_seqs=4)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(client, model, **kw):
    extra = {"s2d2": {"preset": "lossless"}, "structured_outputs": THINKING, **kw.pop("extra_body", {})}
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("max_tokens", 48)
    return client.chat.completions.create(model=model.name, extra_body=extra, **kw)


def test_think_block_is_reasoning_content_whole_and_streamed(model, client):
    out = _chat(client, model).choices[0]
    thought, content = out.message.reasoning_content, out.message.content
    assert thought and " " in thought and "<think>" not in thought and "</think>" not in thought
    assert content and "think>" not in content and out.finish_reason == "stop"
    raw = model.generate(
        model.encode(
            model.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        ),
        regex=THINKING["regex"],
        preset="lossless",
        max_new_tokens=48,
    ).text
    assert raw == f"<think>\n{thought}\n</think>\n\n{content}"
    streamed = {"reasoning": "", "content": ""}
    for chunk in _chat(client, model, stream=True):
        for c in chunk.choices:
            streamed["reasoning"] += getattr(c.delta, "reasoning_content", None) or ""
            streamed["content"] += c.delta.content or ""
    assert streamed == {"reasoning": thought, "content": content}


def test_enable_thinking_false_reaches_the_template(model, client):
    """The published template writes an empty think block after the prompt when thinking is off."""
    on = _chat(client, model, max_tokens=1).usage.prompt_tokens
    off = _chat(client, model, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    block = model.encode("<think>\n\n</think>\n\n")
    assert off.usage.prompt_tokens == on + len(block)


def test_responses_api_gets_a_reasoning_item(model, client):
    """A logit bias on ``<think>`` makes the model open a think block it never closes within the limit:
    the whole and the streamed response carry the same reasoning item and no message."""
    think = model.tokenizer.convert_tokens_to_ids("<think>")
    kw = dict(model=model.name, input="user ab 3", max_output_tokens=6)
    extra = {"s2d2": {"preset": "lossless", "logit_bias": {str(think): 100.0}}}
    whole = client.responses.create(**kw, extra_body=extra)
    assert whole.status == "incomplete" and [o.type for o in whole.output] == ["reasoning"]
    text = whole.output[0].content[0].text
    assert text == "<think>" * 5
    events = list(client.responses.create(**kw, extra_body=extra, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == text and done == [text]
    assert [o.type for o in events[-1].response.output] == ["reasoning"]


def test_reasoning_parser_none_leaves_the_text_whole(model):
    with running_server(create_app(model, max_num_seqs=2, reasoning_parser="none")) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        out = _chat(client, model).choices[0].message
    assert out.content.startswith("<think>\n") and getattr(out, "reasoning_content", None) is None


def test_serve_refuses_an_unknown_reasoning_parser_before_loading(capsys):
    from conftest import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "serve", "--model", "no/such-model", "--reasoning-parser", "deepseek")
    assert_one_line_error(code, err, "unknown reasoning parser 'deepseek'", "none, qwen3")


def test_parser_detected_from_the_template_or_named():
    def fake(template):
        return SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template))

    assert resolve_reasoning_parser(fake("{{ '<think>' }}"), None) == "qwen3"
    assert resolve_reasoning_parser(fake(LLADA2_TEMPLATE), None) is None
    assert resolve_reasoning_parser(fake(None), "qwen3") == "qwen3"
    assert resolve_reasoning_parser(fake("{{ '<think>' }}"), "none") is None
    with pytest.raises(S2D2Error, match="unknown reasoning parser 'deepseek'"):
        resolve_reasoning_parser(fake(None), "deepseek")


def test_history_reasoning_reaches_the_template(model, client):
    """An earlier reply's ``reasoning_content`` (sent back as the client got it) is accepted and rendered
    by the published template (a think block for the turns after the last user message)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "call f first"},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    plain = {k: v for k, v in history[1].items() if k != "reasoning_content"}
    without = [history[0], plain, history[2]]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    kw = dict(max_tokens=1, tools=tools, tool_choice="none", extra_body={"structured_outputs": None})
    got = _chat(client, model, messages=history, **kw).usage.prompt_tokens
    base = _chat(client, model, messages=without, **kw).usage.prompt_tokens
    assert got - base == len(model.encode("<think>\ncall f first\n</think>\n\n"))


def test_a_required_call_may_follow_a_think_block(model, client):
    """With thinking on, a required call's constraint first allows a think block: biased toward
    ``<think>`` and then ``</think>``, the model thinks (briefly), then calls; the call parses after the
    block, whole and streamed. With ``enable_thinking: false`` the constraint starts at the call."""
    from structured_fixtures import SCHEMAS

    tok = model.tokenizer
    bias = {str(tok.convert_tokens_to_ids("<think>")): 50.0, str(tok.convert_tokens_to_ids("</think>")): 60.0}
    tools = [{"type": "function", "function": {"name": "paint", "parameters": SCHEMAS["enum"]}}]
    kw = dict(tools=tools, tool_choice="required", logit_bias=bias, logprobs=True, max_tokens=120)
    out = _chat(client, model, **kw, extra_body={"structured_outputs": None}).choices[0]
    raw = "".join(t.token for t in out.logprobs.content)
    assert raw.startswith("<think></think>\n\n<tool_call>"), raw
    assert out.finish_reason == "tool_calls" and out.message.content is None
    assert out.message.reasoning_content is None
    (call,) = out.message.tool_calls
    assert call.function.name == "paint"
    streamed = []
    for chunk in _chat(client, model, stream=True, **kw, extra_body={"structured_outputs": None}):
        for c in chunk.choices:
            streamed += [(d.function.name, d.function.arguments) for d in c.delta.tool_calls or []]
    assert streamed == [("paint", ""), (None, call.function.arguments)]
    off = {"structured_outputs": None, "chat_template_kwargs": {"enable_thinking": False}}
    plain = _chat(client, model, **kw, extra_body=off).choices[0]
    assert "".join(t.token for t in plain.logprobs.content).startswith("<tool_call>")
    assert plain.message.tool_calls[0].function.name == "paint"


def test_a_final_answer_in_a_format_may_follow_a_think_block(model, client):
    """``response_format`` with tools (calls or an answer) also lets a thinking model think first: the
    same bias gives an empty think block, then a reply that is calls or an answer meeting the schema."""
    import json

    from structured_fixtures import SCHEMAS

    jsonschema = pytest.importorskip("jsonschema")

    tok = model.tokenizer
    bias = {str(tok.convert_tokens_to_ids("<think>")): 50.0, str(tok.convert_tokens_to_ids("</think>")): 60.0}
    bias[str(tok.convert_tokens_to_ids("{"))] = 20.0  # toward the answer
    tools = [{"type": "function", "function": {"name": "paint", "parameters": SCHEMAS["enum"]}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMAS["enum"]}}
    kw = dict(tools=tools, response_format=fmt, logit_bias=bias, logprobs=True, max_tokens=120)
    out = _chat(client, model, **kw, extra_body={"structured_outputs": None}).choices[0]
    raw = "".join(t.token for t in out.logprobs.content)
    assert raw.startswith("<think></think>\n\n{"), raw
    assert out.finish_reason == "stop" and out.message.tool_calls is None
    jsonschema.validate(json.loads(out.message.content), SCHEMAS["enum"])

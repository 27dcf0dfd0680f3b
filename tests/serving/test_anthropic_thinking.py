"""Thinking on ``/v1/messages`` through the official ``anthropic`` SDK: a random model with the published
SDAR (Qwen3-style) chat template gets the ``qwen3`` reasoning parser; its ``<think>`` block comes back as
a ``thinking`` block (whole, and streamed as ``thinking_delta`` events), the same text chat returns as
``reasoning_content``; ``thinking.type`` sets the template's ``enable_thinking``, and an earlier turn's
thinking block reaches the template as that turn's reasoning (both seen in ``count_tokens``, which equals
the template's own rendering). A ``logit_bias`` on ``<think>`` (the ``s2d2`` object's) makes the random
model open a think block."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from reasoning_fixtures import make_thinking_model  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402

USER = [{"role": "user", "content": "user ab 3"}]
TOOLS = [
    {"name": "paint", "input_schema": {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}}}
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = s2d2.load(make_thinking_model(tmp_path_factory.mktemp("thinking")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4)) as base:
        client = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=120)
        yield model, client, base


def _settings(model) -> dict:
    think = model.tokenizer.convert_tokens_to_ids("<think>")
    return {"preset": "lossless", "logit_bias": {str(think): 100.0}}


def test_think_block_is_a_thinking_block_whole_and_streamed(served):
    model, client, base = served
    kw = dict(model=model.name, max_tokens=8, messages=USER, extra_body={"s2d2": _settings(model)})
    out = client.messages.create(**kw)
    chat = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    want = chat.chat.completions.create(
        model=model.name, messages=USER, max_tokens=8, extra_body={"s2d2": _settings(model)}
    ).choices[0]
    assert want.message.reasoning_content
    (block,) = out.content
    assert block.type == "thinking" and block.thinking == want.message.reasoning_content
    assert out.stop_reason == "max_tokens" and want.finish_reason == "length"
    deltas, types = "", []
    with client.messages.stream(**kw) as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                deltas += event.delta.thinking
        final = stream.get_final_message()
    assert deltas == block.thinking
    assert [(b.type, b.thinking) for b in final.content] == [("thinking", block.thinking)]
    assert final.stop_reason == "max_tokens"


def test_thinking_setting_and_history_reach_the_template(served):
    model, client, _ = served
    tok = model.tokenizer

    def rendered(conv, **kw) -> int:
        ids = tok.apply_chat_template(
            conv, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
        )
        return len(ids)

    def counted(messages, **kw) -> int:
        return client.messages.count_tokens(model=model.name, messages=messages, **kw).input_tokens

    assert counted(USER, thinking={"type": "disabled"}) == rendered(USER, enable_thinking=False)
    assert counted(USER, thinking={"type": "enabled", "budget_tokens": 1024}) == rendered(
        USER, enable_thinking=True
    )
    assert rendered(USER, enable_thinking=False) != rendered(USER, enable_thinking=True)
    use = {"type": "tool_use", "id": "toolu_1", "name": "paint", "input": {"c": "red"}}
    thought = {"type": "thinking", "thinking": "pick red", "signature": ""}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}
    history = [*USER, {"role": "assistant", "content": [thought, use]}, result]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "paint", "arguments": '{"c": "red"}'}}
    conv = [
        *USER,
        {"role": "assistant", "content": "", "reasoning_content": "pick red", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "paint", "content": "ok"},
    ]
    tools = [{"type": "function", "function": {"name": "paint", "parameters": TOOLS[0]["input_schema"]}}]
    with_thought = counted(history, tools=TOOLS)
    assert with_thought == rendered(conv, tools=tools)
    history[1]["content"] = [use]
    assert counted(history, tools=TOOLS) < with_thought

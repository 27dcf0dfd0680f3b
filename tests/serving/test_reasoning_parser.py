"""The qwen3 reasoning reader: ``<think>…</think>`` split into reasoning and content the same way for any
split of the text (so streamed deltas reassemble to the whole reply), a tool call after the think block
read as a call, and the published SDAR tokenizer and template (``enable_thinking`` reaches the template;
``<think>`` survives decoding)."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import pytest

from reasoning_fixtures import published_sdar
from s2d2.serving.reasoning.parser import Qwen3ReasoningParser, Reasoning
from s2d2.serving.tools.formats import FORMATS
from s2d2.serving.tools.reply import ReplyReader, ToolCallParser, delta_entries, reply_events, reply_message

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": [1, "</think>"]}}\n</tool_call>'
THOUGHT_THEN_CALL = f"<think>\nThe user wants f.\nCall it.\n</think>\n\n{CALL}"


def _ids():
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


def _split_reasoning(text: str, seed: int | None) -> tuple[str, str]:
    parser, rng, got, i = Qwen3ReasoningParser(), random.Random(seed), [], 0
    while i < len(text):
        j = len(text) if seed is None else i + rng.randint(1, 5)
        got += parser.feed(text[i:j])
        i = j
    got += parser.finish()
    thought = "".join(p.text for p in got if isinstance(p, Reasoning))
    return thought, "".join(p for p in got if isinstance(p, str))


@pytest.mark.parametrize(
    ("text", "thought", "content"),
    [
        ("<think>\nabc def\n</think>\n\nThe answer is 4.", "abc def", "The answer is 4."),
        ("  <think>x</think>y", "x", "y"),
        ("The answer is 4.", "", "The answer is 4."),
        ("<thin", "", "<thin"),
        ("<think>\ncut before the end  ", "cut before the end", ""),
        ("<think>\n\n</think>\n\nno thoughts", "", "no thoughts"),
        ("answer <think>not a block</think>", "", "answer <think>not a block</think>"),
    ],
)
def test_think_block_split_alike_for_any_split(text, thought, content):
    assert _split_reasoning(text, None) == (thought, content)
    for seed in range(40):
        assert _split_reasoning(text, seed) == (thought, content)


def _reader() -> ReplyReader:
    return ReplyReader(ToolCallParser(FORMATS["hermes"], _ids(), {"f"}), Qwen3ReasoningParser())


def test_a_tool_call_after_a_think_block_parses():
    message, cut = reply_message(_reader(), THOUGHT_THEN_CALL)
    assert not cut and message["content"] is None
    assert message["reasoning_content"] == "The user wants f.\nCall it."
    (call,) = message["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "f",
        {"a": [1, "</think>"]},
    )


@dataclass
class _Delta:
    text: str
    token_ids: list
    tool_calls: list | None = None
    reasoning: str | None = None


@dataclass
class _Outcome:
    finish_reason: str
    last: _Delta | None = None


@pytest.mark.parametrize("cut", [0, 25])
def test_streamed_reasoning_and_calls_reassemble_to_the_whole_reply(cut):
    """reply_events over random splits: reasoning, content, calls and finish equal the whole reply's
    (also when the reply is cut inside the call: the call is dropped and the finish is length)."""
    text = THOUGHT_THEN_CALL[: len(THOUGHT_THEN_CALL) - cut]
    whole, was_cut = reply_message(_reader(), text)
    for seed in range(10):
        rng, pieces, i = random.Random(seed), [], 0
        while i < len(text):
            j = i + rng.randint(1, 7)
            pieces.append(_Delta(text[i:j], []))
            i = j

        async def source(pieces=pieces):
            for p in pieces[:-1]:
                yield p
            yield _Outcome("stop", pieces[-1])

        async def run():
            return [item async for item in reply_events(source(), _reader, _Delta)]

        items = asyncio.run(run())
        deltas = [it for it in items[:-1]] + [items[-1].last]
        thought = "".join(d.reasoning or "" for d in deltas)
        calls = [e for d in deltas for e in d.tool_calls or []]
        assert thought == whole["reasoning_content"]
        assert "".join(d.text for d in deltas) == (whole["content"] or "")
        assert [e["function"].get("name") for e in calls if "id" in e] == [
            c["function"]["name"] for c in whole.get("tool_calls", [])
        ]
        assert items[-1].finish_reason == ("length" if was_cut else "tool_calls")
    assert was_cut == bool(cut)


def test_delta_entries_keep_reasoning_apart():
    got = _reader().feed(THOUGHT_THEN_CALL)
    text, thought, entries = delta_entries(got)
    assert (text, thought, len(entries)) == ("", "The user wants f.\nCall it.", 2)


@pytest.fixture(scope="module")
def published_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(published_sdar()), trust_remote_code=False)


def test_published_template_switches_thinking(published_tokenizer):
    """``enable_thinking: false`` reaches the published template: it writes the empty think block."""
    conv = [{"role": "user", "content": "hi"}]
    on = published_tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    off = published_tokenizer.apply_chat_template(
        conv, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"


def test_published_tokenizer_decodes_think_and_call_markup(published_tokenizer):
    """``<think>``, ``</think>`` and ``<tool_call>`` are not special in the published tokenizer: decoded
    with special tokens skipped, the reply still reads as reasoning then a call."""
    tok = published_tokenizer
    ids = tok.encode(THOUGHT_THEN_CALL + "<|im_end|>", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<think>") in ids and tok.convert_tokens_to_ids("<tool_call>") in ids
    text = tok.decode(ids, skip_special_tokens=True)
    message, _ = reply_message(_reader(), text)
    assert message["reasoning_content"] == "The user wants f.\nCall it."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["f"]

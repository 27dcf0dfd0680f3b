"""The tool-call reader (issue 61): any split of a reply's text gives the same content and calls as the
whole text (so streamed deltas reassemble to the non-streamed reply), the markup never reaches the
content, and text that looks like a call but does not parse is returned as text."""

from __future__ import annotations

import random

import pytest

from s2d2.errors import ConfigError
from s2d2.serving.tools.formats import FORMATS, detect_format, format_named
from s2d2.serving.tools.parser import ToolCallParser, collect, parse_reply

FMT = FORMATS["hermes"]
NAMES = {"f", "g"}
TWO_CALLS = (
    'Sure.\n<tool_call>\n{"name": "f", "arguments": '
    '{"a": "x}\\"{<tool_call>", "b": [1, {"c": 2}]}}\n</tool_call>'
    '\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>\n'
)


def _ids():
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


def _split(text, seed):
    rng, parser, events, i = random.Random(seed), ToolCallParser(FMT, _ids()), [], 0
    while i < len(text):
        j = i + rng.randint(1, 6)
        events += parser.feed(text[i:j])
        i = j
    return collect(events + parser.finish())


def test_two_calls_after_text():
    reply = parse_reply(TWO_CALLS, FMT, NAMES, _ids())
    assert reply.content == "Sure."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls] == [
        ("call_0", "f", '{"a": "x}\\"{<tool_call>", "b": [1, {"c": 2}]}'),
        ("call_1", "g", "{}"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        TWO_CALLS,
        "plain text with < and <tool and trailing space  \n",
        "<tool_call>not a call</tool_call> after",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1',
        '  <tool_call>{"name":"f","arguments":{}}</tool_call>  tail text ',
    ],
)
def test_any_split_reads_like_the_whole_text(text):
    whole = ToolCallParser(FMT, _ids())
    want = collect(whole.feed(text) + whole.finish())
    for seed in range(50):
        assert _split(text, seed) == want


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>not a call</tool_call>",
        '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"a": 1',
    ],
)
def test_a_call_that_does_not_parse_is_text(text):
    reply = parse_reply(text, FMT, NAMES, _ids())
    assert (reply.content, reply.tool_calls) == (text, [])


def test_formats_by_name_and_detected():
    assert format_named("llada2").name == "llada2"
    with pytest.raises(ConfigError, match="hermes"):
        format_named("nope")
    assert detect_format("<role>HUMAN</role>{{ x }}<role>OBSERVATION</role>").name == "llada2"
    assert detect_format("<|im_start|>{{ tools }}<tool_call>").name == "hermes"
    assert detect_format(None).name == "hermes"

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
    ],
)
def test_a_call_that_does_not_parse_is_text(text):
    reply = parse_reply(text, FMT, NAMES, _ids())
    assert (reply.content, reply.tool_calls, reply.cut) == (text, [], False)


#: A reply cut at each point inside its second call: the first call is kept, the cut one dropped.
CUTS = [TWO_CALLS[:k] for k in range(TWO_CALLS.index("\n<tool_call>", 10) + 2, len(TWO_CALLS) - 14)]


@pytest.mark.parametrize("text", CUTS[::3])
def test_a_reply_cut_inside_a_call_keeps_every_complete_call(text):
    """Cut inside the second call (by max_tokens or a stop string): the first call whole, the second
    dropped, no markup in the content, and the reader says it was cut; any split reads the same."""
    reply = parse_reply(text, FMT, NAMES, _ids())
    assert reply.content == "Sure." and reply.cut
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls] == [
        ("f", '{"a": "x}\\"{<tool_call>", "b": [1, {"c": 2}]}')
    ]
    for seed in range(5):
        assert _split(text, seed).tool_calls == [
            {**c, "id": f"call_{i}"} for i, c in enumerate(reply.tool_calls)
        ]


def test_a_reply_cut_inside_its_only_call_has_no_content():
    for k in range(len("<tool_call>"), len(TWO_CALLS) // 2):
        text = TWO_CALLS[len("Sure.\n") :][:k]
        reply = parse_reply(text, FMT, NAMES, _ids())
        assert (reply.content, reply.tool_calls, reply.cut) == ("", [], True), text


def test_formats_by_name_and_detected():
    assert format_named("llada2").name == "llada2"
    with pytest.raises(ConfigError, match="hermes"):
        format_named("nope")
    assert detect_format("<role>HUMAN</role>{{ x }}<role>OBSERVATION</role>").name == "llada2"
    assert detect_format("<|im_start|>{{ tools }}<tool_call>").name == "hermes"
    assert detect_format(None).name == "hermes"


def test_responses_events_of_text_then_calls():
    """The Responses stream of a reply with text and two calls: each item opened, filled and closed in
    order, and the final response's output equal to what the events built."""
    import json
    from types import SimpleNamespace

    from s2d2.serving.openai_responses.reply import EventWriter, ResponseHead

    body = SimpleNamespace(
        instructions=None, max_output_tokens=None, parallel_tool_calls=None, temperature=None,
        tool_choice=None, tools=None, top_p=None, text=None, metadata=None,
    )  # fmt: skip
    parser, writer = ToolCallParser(FMT, _ids()), EventWriter(ResponseHead("m", body))
    lines = writer.start()
    for piece in (TWO_CALLS[:9], TWO_CALLS[9:40], TWO_CALLS[40:]):
        lines += writer.feed(parser.feed(piece))
    stats = SimpleNamespace(cached_prompt_tokens=0)
    outcome = SimpleNamespace(finish_reason="stop", stats=stats, completion_tokens=9)
    lines += writer.feed(parser.finish()) + writer.finish(outcome, 3)
    events = [json.loads(line.split("data: ", 1)[1]) for line in lines]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    assert kinds[-1] == "response.completed"
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call", "function_call"]
    assert output[0]["content"][0]["text"] == "Sure."
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert args == output[1]["arguments"] + output[2]["arguments"]
    assert (output[1]["name"], output[2]["name"], output[2]["arguments"]) == ("f", "g", "{}")


def test_a_template_that_fails_on_the_conversation_is_a_400():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from s2d2.serving.errors import APIError
    from s2d2.serving.tools.render import apply_template

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")))
    tok.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}{% endfor %}"
    )
    conv = [{"role": "user", "content": "x"}, {"role": "tool", "content": "1", "tool_call_id": "c"}]
    with pytest.raises(APIError) as err:
        apply_template(tok, conv, None, None)
    assert err.value.status == 400 and err.value.param == "messages" and "no tools" in err.value.message

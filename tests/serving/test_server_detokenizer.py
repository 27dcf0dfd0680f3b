"""The serving layer's incremental detokenizer and stop strings (no server needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from s2d2.serving.detokenizer import TextStream  # noqa: E402


def byte_decode(ids: list[int]) -> str:
    """A byte-level 'tokenizer': each id is one UTF-8 byte."""
    return bytes(ids).decode("utf-8", errors="replace")


def stream_all(ts: TextStream, pieces: list[list[int]]) -> list[str]:
    out = [ts.push(p) for p in pieces]
    out.append(ts.finish())
    return out


def test_multibyte_characters_are_never_broken():
    text = "naïve café — 東京 🚀!"
    data = list(text.encode("utf-8"))
    ts = TextStream(byte_decode)
    sent = stream_all(ts, [[b] for b in data])
    assert "".join(sent) == text
    assert all("\ufffd" not in s for s in sent)
    # every piece is whole characters: a prefix of the text at every point
    acc = ""
    for s in sent:
        acc += s
        assert text.startswith(acc)


def test_stop_string_is_cut_and_not_returned():
    ts = TextStream(byte_decode, stop=["STOP"])
    sent = stream_all(ts, [[b] for b in b"abc STOP def"])
    assert "".join(sent) == "abc "
    assert ts.stopped


def test_partial_stop_prefix_is_held_back_then_released():
    ts = TextStream(byte_decode, stop=["##"])
    assert ts.push(list(b"a#")) == "a"  # '#' could start '##'
    assert ts.push(list(b"b")) == "#b"  # it did not
    assert ts.finish() == ""
    assert ts.text == "a#b"


def test_earliest_of_several_stops_wins():
    ts = TextStream(byte_decode, stop=["zz", "."])
    assert "".join(stream_all(ts, [list(b"x. y zz")])) == "x"


def test_nothing_is_taken_back_when_the_tokenizer_rewrites():
    texts = {1: "ab", 2: "aX"}  # a decode that rewrites sent text when the second token arrives
    ts = TextStream(lambda ids: texts[len(ids)])
    assert ts.push([1]) == "ab"
    assert ts.push([2]) == ""
    assert ts.finish() == ""
    assert ts.text == "ab"


def test_token_count_runs_through_the_stop_string_and_never_past_it():
    # the stop string completes at token 6 of 12 pushed in one step: 6 tokens count, whatever follows
    ts = TextStream(byte_decode, stop=["ST"])
    assert ts.push(list(b"abc STxyz de")) == "abc "
    assert ts.stopped and ts.stop_at == 6 and ts.n_tokens == 6
    # a stop string split over two pushes: counted through the push's token that completed it
    ts = TextStream(byte_decode, stop=["ST"])
    ts.push(list(b"ab S"))
    ts.push(list(b"Tqq"))
    assert ts.text == "ab " and ts.n_tokens == 5
    # no stop string: every token counts
    ts = TextStream(byte_decode, stop=["ST"])
    stream_all(ts, [list(b"abc"), list(b"de")])
    assert not ts.stopped and ts.n_tokens == 5

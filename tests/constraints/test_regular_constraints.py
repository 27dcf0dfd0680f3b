"""Regular constraints on the built-in model: every decoder under them, dead ends found exactly, and
punctuation read as the text reads.

- The paper presets and every routing policy verify from the grammar's frontier: the request that
  failed with "a verified span starts at slot N" ends, conforming.
- ``[a-z]+e``: constrained AR no longer takes a word after which nothing completes; it and every
  lossless preset give the same tokens; every token a mask row allows leads to a state that completes.
- ``[0-9]+x`` and ``[0-9]{40}x`` are refused at once (the vocabulary writes no ``x`` after a digit).
- ``5\\.`` gives ``"5."``; the model's own answer format as a regex gives the unconstrained answer.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("xgrammar")

import s2d2  # noqa: E402
from conftest import examples  # noqa: E402
from s2d2.constraints.automaton import NotRegular, regex_dfa  # noqa: E402
from s2d2.constraints.liveness import allowed_ids, can_complete, clear_bit  # noqa: E402
from s2d2.constraints.matcher import GrammarState  # noqa: E402
from s2d2.constraints.spec import OutputConstraint  # noqa: E402
from s2d2.errors import ConfigError  # noqa: E402

PROMPT = "Ben has 3 apples. He buys 2 more. How many apples does Ben have?"
ANSWER_FORMAT = r"[0-9]+ [+] [0-9]+ = [0-9]+\. #### [0-9]+"
LOSSLESS = [{"preset": "lossless"}, {"preset": "lossless-fused"}, {"preset": "lossless-auto"}]
EVERY_DECODER = [
    {"decoder": "ar"},
    {"decoder": "static"},
    {"decoder": "dynamic"},
    {"decoder": "eb"},
    {},
    *LOSSLESS,
    {"preset": "paper-sdar-a"},
    {"preset": "paper-sdar-b"},
    {"preset": "paper-fast-dllm-v2-sub4"},
    *({"decoder": "s2d2", "policy": p} for p in ("score", "hysteresis", "min-span", "ucb")),
]


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=16)


def _name(settings_: dict) -> str:
    return "-".join(str(v) for v in settings_.values()) or "default"


@pytest.mark.parametrize("settings_", EVERY_DECODER, ids=_name)
def test_every_decoder_ends_conforming_under_regular_constraints(model, settings_):
    """Greedy and sampled, the issue's reproduction included: no error, and a stopped output matches."""
    cases = [("[0-9]+ apples", 0.0, 0), ("[0-9]+ apples", 1.0, 3), ("[a-z]+e", 0.0, 0), ("[a-z]+e", 1.0, 5)]
    per = [{**settings_, "regex": rx, "temperature": t, "seed": s} for rx, t, s in cases]
    got = model.generate_batch([PROMPT] * len(per), per_request=per, max_new_tokens=16, errors="return")
    for (rx, t, _), res in zip(cases, got, strict=True):
        assert res.error is None, (rx, t, res.error)
        assert res.stats.finish_reason in ("stop", "length")
        if res.stats.finish_reason == "stop":
            assert re.fullmatch(rx, res.text), (rx, res.text)


def test_dead_end_words_are_never_taken_and_lossless_equals_ar(model):
    """``[a-z]+e`` at T=0: AR used to take ``into`` (no piece continues it to an ``e``) and fail."""
    ar = model.generate(PROMPT, max_new_tokens=16, temperature=0, decoder="ar", regex="[a-z]+e")
    assert ar.stats.finish_reason == "stop" and re.fullmatch("[a-z]+e", ar.text), ar.text
    for settings_ in [*LOSSLESS, {"preset": "paper-sdar-a"}, {"preset": "paper-sdar-b"}]:
        got = model.generate(PROMPT, max_new_tokens=16, temperature=0, regex="[a-z]+e", **settings_)
        assert got.token_ids == ar.token_ids, (settings_, got.text, ar.text)


@pytest.mark.parametrize("rx", ["[a-z]+e", "[0-9]+ apples", "(ben|box)[0-9]?"])
def test_every_allowed_token_can_still_complete(model, rx):
    """Along a path, each mask row allows only tokens after which an exhaustive search completes."""
    compiled = model.compile_constraint(OutputConstraint("regex", rx))
    assert compiled.regular is not None
    g, vocab = GrammarState(compiled), compiled.vocab_size
    for _ in range(4):
        row = g.masks((), 1)
        allowed = allowed_ids(row, 0, vocab)
        assert allowed
        for t in allowed:
            if t in model.info.eos_token_ids:
                continue
            assert g.matcher.accept_token(t)
            assert can_complete(g.matcher, vocab, 100_000, 64) is True, (rx, t)
            g.matcher.rollback(1)
        step = next((t for t in allowed if t not in model.info.eos_token_ids), None)
        if step is None:
            break
        g.advance([step])


@pytest.mark.parametrize("rx", ["[0-9]+x", "[0-9]{40}x", "(12|34)+ zzz"])
def test_provably_unsatisfiable_regexes_are_refused_at_once(model, rx):
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="cannot write any output the regex constraint"):
        model.generate(PROMPT, max_new_tokens=16, regex=rx)
    assert time.perf_counter() - t < 1.0


def test_a_full_stop_reads_as_the_text_does(model):
    out = model.generate(PROMPT, max_new_tokens=8, temperature=0, regex=r"5\.")
    assert out.text == "5." and out.stats.finish_reason == "stop"
    first = model.generate(PROMPT, max_new_tokens=8, temperature=0, regex=r"[.!?] [0-9]+")
    assert re.fullmatch(r"[.!?] [0-9]+", first.text) and first.stats.finish_reason == "stop"
    with pytest.raises(ConfigError, match="cannot write"):  # the decoded text never starts with a space
        model.generate(PROMPT, max_new_tokens=8, regex=" 5")
    with pytest.raises(ConfigError, match="cannot write"):  # the decoder never writes " ." after a word
        model.generate(PROMPT, max_new_tokens=8, regex=r"5 \.")


@pytest.mark.parametrize("settings_", [{"decoder": "ar"}, *LOSSLESS, {"preset": "paper-sdar-a"}], ids=_name)
def test_the_answer_format_as_a_regex_gives_the_unconstrained_answer(model, settings_):
    free = model.generate(PROMPT, max_new_tokens=48, temperature=0, decoder="ar")
    assert re.fullmatch(ANSWER_FORMAT, free.text), free.text
    held = model.generate(PROMPT, max_new_tokens=48, temperature=0, regex=ANSWER_FORMAT, **settings_)
    assert held.text == free.text and held.token_ids == free.token_ids


# ------------------------------------------------------------------------ the automaton itself
ATOMS = ["a", "b", "[ab]", "[^a]", ".", r"\d", "c", "(a|bc)", "(x?)"]
QUANTS = ["", "*", "+", "?", "{2}", "{1,3}", "*?"]


@st.composite
def regexes(draw):
    parts = draw(st.lists(st.tuples(st.sampled_from(ATOMS), st.sampled_from(QUANTS)), min_size=1, max_size=4))
    body = "".join(a + q for a, q in parts)
    if draw(st.booleans()):
        body += "|" + draw(st.sampled_from(ATOMS))
    return body


@settings(max_examples=examples(200), deadline=None)
@given(rx=regexes(), texts=st.lists(st.text(alphabet="abc1 \n", max_size=6), min_size=1, max_size=8))
def test_the_automaton_accepts_what_python_regexes_match(rx, texts):
    dfa = regex_dfa(rx)
    for text in texts:
        assert dfa.accepting(dfa.walk(dfa.start, text)) == bool(re.fullmatch(rx, text)), (rx, text)


@pytest.mark.parametrize("rx", [r"(a)\1", "(?=a)a", "(?i)a", "a{2000}", "[[:digit:]]"])
def test_what_the_automaton_does_not_model_is_said(rx):
    with pytest.raises(NotRegular):
        regex_dfa(rx)


def test_an_unmodelled_regex_keeps_the_bounded_search(model):
    compiled = model.compile_constraint(OutputConstraint("regex", "[0-9]{1,1001} apples"))
    assert compiled.regular is None  # a repeat past the automaton's bound
    out = model.generate(PROMPT, max_new_tokens=6, temperature=0, regex="[0-9]{1,1001} apples")
    assert out.stats.finish_reason == "length" or re.fullmatch("[0-9]+ apples", out.text)


def test_clearing_the_sign_bit_of_a_full_word():
    bits = torch.full((1, 2), -1, dtype=torch.int32)
    clear_bit(bits, 0, 31)
    clear_bit(bits, 0, 32)
    assert allowed_ids(bits, 0, 64) == [*range(31), *range(33, 64)]


def test_grammars_keep_the_bounded_search_on_every_row(model):
    """An EBNF grammar has no exact analysis; its bounded look-ahead now checks every row of this
    vocabulary (not only narrow ones), so AR no longer takes ``into`` under ``[a-z]+ "e"``."""
    ar = model.generate(PROMPT, max_new_tokens=10, temperature=0, decoder="ar", grammar='root ::= [a-z]+ "e"')
    lossless = model.generate(
        PROMPT, max_new_tokens=10, temperature=0, preset="lossless", grammar='root ::= [a-z]+ "e"'
    )
    assert ar.stats.finish_reason == "stop" and ar.token_ids == lossless.token_ids

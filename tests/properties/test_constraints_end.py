r"""Every constrained request ends: random choices, regexes and small grammars over the built-in model's
WordPiece vocabulary and a byte-level one, every decoder (the paper presets and the routing policies
included), temperatures 0, 0.7 and 1. The terms include dead-end words (``[a-z]+e``), punctuation
(``\.``) and letters the vocabulary cannot write after a digit (``x``). Each request either is refused
at admission (a one-line ConfigError: the vocabulary cannot write any output the constraint allows) or
ends within its token limit, its forwards bounded by it, with text the constraint allows when it
stopped; never another error. At temperature 0 every lossless preset equals constrained AR token for
token (one dead-end rule for every decoder)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("xgrammar")

import s2d2  # noqa: E402
from conftest import examples  # noqa: E402
from s2d2.errors import ConfigError  # noqa: E402
from structured_fixtures import make_json_model  # noqa: E402

DECODERS = [
    {"decoder": "ar"},
    {"decoder": "static"},
    {"decoder": "dynamic"},
    {"decoder": "eb"},
    {},
    {"preset": "lossless"},
    {"preset": "lossless-fused"},
    {"preset": "lossless-auto"},
    {"preset": "paper-sdar-a"},
    {"preset": "paper-sdar-b"},
    {"decoder": "s2d2", "policy": "score"},
    {"decoder": "s2d2", "policy": "hysteresis"},
    {"decoder": "s2d2", "policy": "min-span"},
    {"decoder": "s2d2", "policy": "ucb"},
]
LOSSLESS = ("lossless", "lossless-fused", "lossless-auto")
TEMPERATURES = (0.0, 0.7, 1.0)
MAX_NEW = 10
#: words of each vocabulary (and a few it cannot write): WordPiece words and numbers; byte-level text
WORDS = {
    "tiny": ["apples", "a", "12", "5", "ben", "avocado", "3 apples", "box", "zebra", "7 7"],
    "bytes": ["red", "blue", "12", "ab", "x y", "name", "q"],
}
#: (regex, EBNF) of the other terms: classes, a word ending in e, a full stop, a letter after digits
PIECES = [
    ("[0-9]", "[0-9]"),
    ("[0-9]+", "[0-9]+"),
    ("[a-c]", "[a-c]"),
    ("[a-z]+e", '[a-z]+ "e"'),
    (r"\.", '"."'),
    ("x", '"x"'),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tiny = s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=2)
    json = s2d2.load(make_json_model(tmp_path_factory.mktemp("bytes")), device="cpu", dtype="fp32")
    return {"tiny": tiny, "bytes": json}


def _term(words):
    """One term: (regex source, Python regex, EBNF) of a word (no regex syntax in it) or a class."""
    word = st.sampled_from(words).map(lambda w: (w, w, '"' + w + '"'))
    piece = st.sampled_from(PIECES).map(lambda p: (p[0], p[0], p[1]))
    return st.one_of(word, piece)


@st.composite
def constraints(draw, vocab):
    """``(keyword, value, Python regex the output must match when it stops)``."""
    words = WORDS[vocab]
    kind = draw(st.sampled_from(["choice", "regex", "grammar"]))
    if kind == "choice":
        options = draw(st.lists(st.sampled_from(words), min_size=1, max_size=3, unique=True))
        return "choice", options, "|".join(re.escape(o) for o in options)
    alts = draw(st.lists(st.lists(_term(words), min_size=1, max_size=2), min_size=1, max_size=3))
    pattern = "|".join("".join(t[1] for t in alt) for alt in alts)
    if kind == "regex":
        return "regex", "|".join("".join(t[0] for t in alt) for alt in alts), pattern
    return "grammar", "root ::= " + " | ".join(" ".join(t[2] for t in alt) for alt in alts), pattern


def _check(model, prompt, kw, value, pattern, settings_, temperature, seed):
    try:
        out = model.generate(
            prompt, max_new_tokens=MAX_NEW, temperature=temperature, seed=seed, **{kw: value}, **settings_
        )
    except ConfigError as exc:  # refused at admission, in one line, naming the constraint's kind
        assert "\n" not in str(exc) and "cannot write any output" in str(exc), str(exc)
        return None
    eos = set(model.adapter.info.eos_token_ids)
    assert len(out.token_ids) <= MAX_NEW
    assert out.stats.nfe <= 3 * MAX_NEW + 8  # (the forwards are bounded by the token limit)
    stopped = bool(out.token_ids) and out.token_ids[-1] in eos
    if stopped:
        assert re.fullmatch(pattern, out.text), (value, out.text)
    assert not out.text.startswith("@@")
    return out


@pytest.mark.parametrize("vocab", ["tiny", "bytes"])
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_every_constrained_request_ends(models, vocab, data):
    model = models[vocab]
    kw, value, pattern = data.draw(constraints(vocab))
    settings_ = data.draw(st.sampled_from(DECODERS))
    temperature = data.draw(st.sampled_from(TEMPERATURES))
    seed = data.draw(st.integers(0, 1000))
    prompt = "Ben has 3 apples. How many?" if vocab == "tiny" else "color ab 3"
    out = _check(model, prompt, kw, value, pattern, settings_, temperature, seed)
    if out is not None and temperature == 0 and settings_.get("preset") in LOSSLESS:
        ar = model.generate(prompt, max_new_tokens=MAX_NEW, decoder="ar", **{kw: value})
        assert out.token_ids == ar.token_ids

"""One token vocabulary in the server's logprobs: a token is shown everywhere (completions' ``tokens`` and
``top_logprobs`` keys, chat's ``token``, ``top_logprobs`` tokens and ``bytes``) as the text it adds at
its position, so the chosen token is a key of its own ``top_logprobs`` entry with the same logprob.

Checked through the ``openai`` client against a real server, streamed and not, on the built-in model
(WordPiece, whose ``@@`` continuations must show as the digits they add) and on a byte-level BPE
tokenizer trained here on text with multi-byte characters, paired with a random SDAR network (whose
near-random choices cross incomplete characters and colliding alternatives).
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from conftest import make_random_sdar  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.serving.token_logprobs import Scored, TokenTexts, completion_format  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:3]]
TOP = 4
N_TOKENS = 20
#: decoders whose logprobs come from the AR mode (lossless) and from the drafter (dynamic)
SETTINGS = [{}, {"s2d2": {"decoder": "dynamic", "block_size": 8, "threshold": 0.5}}]


def _completion_positions(client, prompt, stream, extra):
    kw = dict(model=client.served, prompt=prompt, max_tokens=N_TOKENS, logprobs=TOP, extra_body=extra)
    if not stream:
        choice = client.completions.create(**kw).choices[0]
        lp = choice.logprobs
        return choice.text, list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True))
    text, rows = "", []
    for chunk in client.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                lp = choice.logprobs
                rows += list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True))
    return text, rows


def _chat_positions(client, prompt, stream, extra):
    kw = dict(
        model=client.served,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=N_TOKENS,
        logprobs=True,
        top_logprobs=TOP,
        extra_body=extra,
    )
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        return choice.message.content, list(choice.logprobs.content)
    text, entries = "", []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries += choice.logprobs.content
    return text, entries


#: how far one request's logprobs may move when it is sent again: the second request reuses the first's
#: cached prompt pages (the prefix cache), so its logits come from forwards of other shapes (float32 sums
#: in another order); the tokens and texts are equal exactly
LOGPROB_TOLERANCE = 1e-5


def _same_values(a, b) -> bool:
    """Nested rows equal, floats within :data:`LOGPROB_TOLERANCE`, everything else exactly."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= LOGPROB_TOLERANCE
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_completions(client, prompt, extra):
    """Every position: the token is a key of its entry with the same logprob; streamed == not."""
    runs = [_completion_positions(client, prompt, stream, extra) for stream in (False, True)]
    assert _same_values(runs[0], runs[1]), (runs[0], runs[1])
    text, rows = runs[0]
    assert len(rows) == N_TOKENS
    for token, logprob, top in rows:
        assert top[token] == logprob
        assert max(top.values()) == logprob  # greedy: the chosen token is the most likely
        assert len(top) <= TOP + 1
    assert "".join(t for t, _, _ in rows) == text.rstrip("\ufffd")
    return rows


def _chat_row(e):
    return e.token, e.logprob, e.bytes, [(t.token, t.logprob, t.bytes) for t in e.top_logprobs]


def check_chat(client, prompt, extra):
    runs = [_chat_positions(client, prompt, stream, extra) for stream in (False, True)]
    plain, streamed = ([_chat_row(e) for e in run[1]] for run in runs)
    assert runs[0][0] == runs[1][0] and _same_values(plain, streamed), (plain, streamed)
    text, entries = runs[0]
    assert len(entries) == N_TOKENS
    for token, logprob, raw, top in plain:
        assert raw == list(token.encode("utf-8"))
        assert all(b == list(t.encode("utf-8")) for t, _, b in top)
        assert (token, logprob, raw) in top
        assert len({t for t, _, _ in top}) == len(top)  # one value per text
    assert "".join(e.token for e in entries) == text.rstrip("\ufffd")
    return plain


class _Client(openai.OpenAI):
    served: str


def _client(url: str, served: str) -> _Client:
    c = _Client(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    c.served = served
    return c


# ---------------------------------------------------------------------------------------------- tiny-gsm
@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", max_num_seqs=8)


@pytest.fixture(scope="module")
def tiny_client(tiny):
    with running_server(create_app(tiny, max_num_seqs=8)) as url:
        yield _client(url, "tiny-gsm")


@pytest.mark.parametrize("extra", SETTINGS, ids=["lossless", "dynamic"])
def test_builtin_completions_one_vocabulary(tiny_client, extra):
    for q in QUESTIONS:
        rows = check_completions(tiny_client, q, extra)
        keys = [k for _, _, top in rows for k in top]
        assert not any("@@" in k for k in keys)  # a continuation shows the digit it adds
        # a digit after a digit joins its number ("42": " 4", "2"); after a word it starts its own
        assert any(t.isdigit() for t, _, _ in rows) and any(t.startswith(" ") for t, _, _ in rows)


@pytest.mark.parametrize("extra", SETTINGS, ids=["lossless", "dynamic"])
def test_builtin_chat_one_vocabulary(tiny_client, extra):
    for q in QUESTIONS:
        entries = check_chat(tiny_client, q, extra)
        assert not any("@@" in t for e in entries for t, _, _ in e[3])


def test_word_piece_alternatives_show_the_text_they_add(tiny):
    """After ``1`` the continuation ``@@2`` adds ``2`` and the word ``2`` adds `` 2``: two texts."""
    vocab = tiny.tokenizer.get_vocab()
    one, cont_two, two = vocab["1"], vocab["@@2"], vocab["2"]
    texts = TokenTexts(tiny.decode_ids)
    texts.add([vocab["="], one])
    assert texts.alternatives([cont_two, two]) == ["2", " 2"]
    assert TokenTexts(tiny.decode_ids).alternatives([cont_two]) == [tiny.decode_ids([cont_two])]


def test_colliding_texts_keep_one_value_and_the_chosen_token_wins_its_key():
    scored = Scored(
        texts=[""],
        ids=[7],
        logprobs=[-2.0],
        sources=["ar"],
        top=[[(3, -0.5), (7, -2.0), (9, -2.5), (5, -3.0)]],
        top_texts=[["", "", "x", "x"]],
    )
    # tokens 3 and 7 both add "": the chosen token 7's value is what its key shows; "x" keeps token 9's
    assert completion_format(scored, 4)["top_logprobs"] == [{"": -2.0, "x": -2.5}]
    assert scored.alternatives(0, 1) == {"": -2.0}


# ---------------------------------------------------------------------------------------------- BPE
BPE_TEXT = [
    "The café on the corner sells crème brûlée for 4 € and naïve tourists pay 6 €.",
    "東京 and 大阪 are cities; ünïcödé text mixes bytes of two, three and four: 😀 🚀.",
    "Numbers like 1234 and 56789 split into pieces; words like lowering and lowest share a stem.",
]


def _byte_level_model(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(BPE_TEXT * 4, trainer)
    n = tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"eos_token": "<eos>", "mask_token": "<mask>"})
    assert fast.convert_tokens_to_ids(["<eos>", "<mask>"]) == [n, n + 1]
    make_random_sdar(directory, vocab=n + 2, seed=3, std=0.35)
    fast.save_pretrained(str(directory))
    return s2d2.load(str(directory), device="cpu", dtype="fp32", max_num_seqs=4)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return _byte_level_model(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def bpe_client(bpe):
    with running_server(create_app(bpe, max_num_seqs=4)) as url:
        yield _client(url, bpe.name)


BPE_PROMPTS = ["The café", "東京 and", "Numbers like 12"]


@pytest.mark.parametrize("extra", [{"s2d2": {"decoder": "ar", "ignore_eos": True}}], ids=["ar"])
def test_byte_level_bpe_one_vocabulary(bpe_client, extra):
    incomplete = 0
    for prompt in BPE_PROMPTS:
        rows = check_completions(bpe_client, prompt, extra)
        check_chat(bpe_client, prompt, extra)
        # raw byte-level pieces (Ġ for a space, Ã/Â for UTF-8 bytes) never show
        assert not any(ch in key for _, _, top in rows for key in top for ch in "ĠÃÂ")
        incomplete += sum(t == "" for t, _, _ in rows)
    assert incomplete > 0  # the random network does cross incomplete characters (shown as "")

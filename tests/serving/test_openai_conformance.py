"""The OpenAI API as clients use it: each parameter of the OpenAI API reference (completions and chat)
through the official ``openai`` client (sync, async, streamed) against a real server on 127.0.0.1.

Supported parameters change the output as documented (README, "Serving"); refused ones get a 400 whose
``param`` names them. Sampling stays exact: at temperature 1 the lossless family (and the shipped
default) sample AR's distribution, checked on 2,000 seeded samples through the library's batched engine.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import metric, running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.serving.chat import encode_text, fallback_chat_text  # noqa: E402
from s2d2.serving.prepare import STRICT_SAMPLING_NOTE, derived_seed  # noqa: E402
from s2d2.serving.protocol import ChatMessage  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:20]]
Q = QUESTIONS[0]
#: the four decoders whose usage must agree: AR, lossless, lossless-fused and the shipped default
DECODERS = {
    "ar": {"decoder": "ar"},
    "lossless": {"preset": "lossless"},
    "lossless-fused": {"preset": "lossless-fused"},
    "default": {},
}


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=16)


@pytest.fixture(scope="module")
def url(model):
    with running_server(create_app(model, max_num_seqs=16, max_queue=128)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def aclient(url):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def gather(*coros):
    async def main():
        return await asyncio.gather(*coros)

    return asyncio.run(main())


def complete(url, **kw):
    """One completion through the async client (call inside ``gather``)."""

    async def one():
        async with aclient(url) as c:
            return await c.completions.create(model="tiny-gsm", **kw)

    return one()


# ---------------------------------------------------------------------------------------------- sampling
N_SAMPLES = 2000
POSITIONS = 8
#: a prompt the model answers in many ways at temperature 1 (AR's samples give some 200 final answers)
SAMPLED = "Tom has 11 boxes with 4 apples each. How many apples?"
END = -1  # the "position past the end" category


def _samples(m, **settings):
    """2,000 seeded samples of one prompt at temperature 1 through the library's batched engine."""
    per = [{"seed": i} for i in range(N_SAMPLES)]
    res = m.generate_batch(
        [SAMPLED] * N_SAMPLES, temperature=1.0, max_new_tokens=48, per_request=per, **settings
    )
    cols = [
        collections.Counter(r.token_ids[i] if i < len(r.token_ids) else END for r in res)
        for i in range(POSITIONS)
    ]
    answers = collections.Counter(r.text.split("####")[-1].strip() if "####" in r.text else None for r in res)
    return cols, answers


def tv_and_threshold(a: collections.Counter, b: collections.Counter, n: int, delta: float = 1e-4):
    """Total variation of two empirical distributions of ``n`` samples each, and the level it stays
    under with probability >= 1 - delta when both sample one distribution p: E[TV] <= 1/2 sum_k
    sqrt(2 p_k / n) (p_k estimated by the pooled frequencies), and TV concentrates within
    sqrt(ln(1/delta) / n) of its mean (McDiarmid: one sample moves it by at most 1/n)."""
    keys = set(a) | set(b)
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in keys) / n
    mean = 0.5 * sum(math.sqrt(2 * ((a[k] + b[k]) / (2 * n)) / n) for k in keys)
    return tv, mean + math.sqrt(math.log(1 / delta) / n)


@pytest.fixture(scope="module")
def sampling_model():
    return s2d2.load("tiny-gsm", max_num_seqs=64)


@pytest.fixture(scope="module")
def ar_samples(sampling_model):
    return _samples(sampling_model, decoder="ar")


@pytest.mark.parametrize("settings", [{"preset": "lossless"}, {}], ids=["lossless", "default"])
def test_sampling_at_temperature_1_matches_ar_sampling(sampling_model, ar_samples, settings):
    cols, answers = _samples(sampling_model, **settings)
    ar_cols, ar_answers = ar_samples
    for i in range(POSITIONS):
        tv, bound = tv_and_threshold(cols[i], ar_cols[i], N_SAMPLES)
        assert tv < bound, f"position {i}: TV {tv:.3f} >= {bound:.3f}"
    tv, bound = tv_and_threshold(answers, ar_answers, N_SAMPLES)
    assert tv < bound, f"final answer: TV {tv:.3f} >= {bound:.3f}"
    # the test can fail: AR's own samples are far from always answering its greedy answer
    greedy = collections.Counter({ar_answers.most_common(1)[0][0]: N_SAMPLES})
    tv, bound = tv_and_threshold(greedy, ar_answers, N_SAMPLES)
    assert tv > 2 * bound


def test_same_seed_same_text_alone_batched_and_streamed(url, client):
    body = dict(prompt=Q, max_tokens=48, temperature=1.0, seed=7)
    alone = client.completions.create(model="tiny-gsm", **body).choices[0].text
    others = [complete(url, **{**body, "seed": s}) for s in range(20, 27)]
    batched = gather(complete(url, **body), *others)
    assert batched[0].choices[0].text == alone
    assert len({r.choices[0].text for r in batched}) > 1  # the seeds do differ
    streamed = client.completions.create(model="tiny-gsm", stream=True, **body)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == alone
    chat = dict(messages=[{"role": "user", "content": Q}], max_tokens=48, temperature=1.0, seed=7)
    assert client.chat.completions.create(model="tiny-gsm", **chat).choices[0].message.content == alone


def test_streamed_finish_reason_comes_once_with_the_last_text(client):
    full = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=5)
    chunks = list(client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=5, stream=True))
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert finishing == [chunks[-1]] and chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].text  # the last tokens' text rides with the finish reason
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert all(c.usage is None for c in chunks)  # no usage unless stream_options asks for it
    chat = list(
        client.chat.completions.create(
            model="tiny-gsm", messages=[{"role": "user", "content": Q}], max_tokens=5, stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in chat][-1] == "length"
    assert (
        sum(c.choices[0].finish_reason is not None for c in chat) == 1 and chat[-1].choices[0].delta.content
    )


def test_n_choices_equal_separate_requests_with_derived_seeds(url, client):
    body = dict(prompt=Q, max_tokens=48, temperature=1.0)
    four = client.completions.create(model="tiny-gsm", n=4, seed=11, **body)
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    separate = gather(*(complete(url, seed=derived_seed(11, i), **body) for i in range(4)))
    assert [c.text for c in four.choices] == [r.choices[0].text for r in separate]
    assert four.usage.completion_tokens == sum(r.usage.completion_tokens for r in separate)
    assert four.usage.prompt_tokens == separate[0].usage.prompt_tokens  # the prompt counts once
    # streamed: each index's pieces are that choice's text
    texts = collections.defaultdict(str)
    for chunk in client.completions.create(model="tiny-gsm", n=4, seed=11, stream=True, **body):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert [texts[i] for i in range(4)] == [c.text for c in four.choices]
    assert derived_seed(2**64 - 1, 1) == 0 and derived_seed(None, 3) is None  # wraps; unseeded stays so
    # chat too
    chat = client.chat.completions.create(
        model="tiny-gsm",
        messages=[{"role": "user", "content": Q}],
        n=2,
        seed=11,
        max_tokens=48,
        temperature=1.0,
    )
    assert [c.message.content for c in chat.choices] == [c.text for c in four.choices[:2]]


def test_list_of_prompts_equals_separate_requests(url, client, model):
    prompts = QUESTIONS[:8]
    body = dict(max_tokens=48, temperature=0.7, seed=3)
    whole = client.completions.create(model="tiny-gsm", prompt=prompts, **body)
    separate = gather(*(complete(url, prompt=p, **body) for p in prompts))
    assert [c.index for c in whole.choices] == list(range(8))
    assert [c.text for c in whole.choices] == [r.choices[0].text for r in separate]
    assert whole.usage.prompt_tokens == sum(r.usage.prompt_tokens for r in separate)
    assert whole.usage.completion_tokens == sum(r.usage.completion_tokens for r in separate)
    # token-id prompts, two choices each: index = prompt * n + choice, choice j seeded seed + j
    by_ids = client.completions.create(
        model="tiny-gsm", prompt=[model.encode(p) for p in prompts[:2]], n=2, **body
    )
    assert [c.index for c in by_ids.choices] == [0, 1, 2, 3]
    assert [by_ids.choices[i].text for i in (0, 2)] == [c.text for c in whole.choices[:2]]
    second = complete(url, prompt=prompts[1], **{**body, "seed": derived_seed(3, 1)})
    assert by_ids.choices[3].text == gather(second)[0].choices[0].text


def test_completion_tokens_with_stop_agree_across_decoders(url, model):
    """Usage counts the returned text's tokens through the stop string, never what a decoder committed
    past it in the same step: the same for every decoder, and the tokenizer's count of the text plus
    the token that ended it."""
    found = {}
    for name, s2 in DECODERS.items():
        outs = gather(
            *(complete(url, prompt=q, max_tokens=64, stop=".", extra_body={"s2d2": s2}) for q in QUESTIONS)
        )
        found[name] = [
            (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) for r in outs
        ]
    assert found["lossless"] == found["ar"] == found["lossless-fused"] == found["default"]
    stopped = 0
    for text, reason, tokens in found["ar"]:
        n_text = len(model.encode(text)) if text else 0
        assert tokens == n_text + (1 if reason == "stop" else 0), (text, reason, tokens)
        stopped += reason == "stop"
    assert stopped >= 15
    # the engine stops decoding a row once its stop string is complete (AR: one forward per token, so
    # about as many forwards as counted tokens, where the whole answer would take several times more)
    cut = gather(complete(url, prompt=Q, max_tokens=64, stop=".", extra_body={"s2d2": {"decoder": "ar"}}))[0]
    full = gather(complete(url, prompt=Q, max_tokens=64, extra_body={"s2d2": {"decoder": "ar"}}))[0]
    assert cut.model_extra["s2d2"]["nfe"] <= cut.usage.completion_tokens + 3
    assert full.model_extra["s2d2"]["nfe"] >= 3 * cut.usage.completion_tokens


# ---------------------------------------------------------------------------------------------- refused
REFUSED = [
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("response_format", {"response_format": {"type": "bogus"}}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("tool_choice", {"tool_choice": "auto"}),
    ("functions", {"functions": [{"name": "f", "parameters": {}}]}),
    ("function_call", {"function_call": "auto"}),
    ("stream_options", {"stream_options": {"include_usage": True}}),
    ("max_tokens", {"max_tokens": 600}),
    ("presence_penalty", {"presence_penalty": 2.5}),
    ("frequency_penalty", {"frequency_penalty": -3.0}),
    ("logit_bias", {"logit_bias": {"5": 101}}),
    ("logit_bias", {"logit_bias": {"99999": 1}}),
    ("logit_bias", {"logit_bias": {"five": 1}}),
    ("min_tokens", {"min_tokens": -1}),
    ("top_k", {"top_k": -2}),
    ("n", {"n": 0}),
]
REFUSED_COMPLETIONS = [
    ("best_of", {"best_of": 2}),
    ("best_of", {"best_of": 1, "n": 2}),
    ("suffix", {"suffix": "x"}),
    ("logprobs", {"logprobs": 21}),
]
REFUSED_CHAT = [
    ("top_logprobs", {"top_logprobs": 2}),
    ("top_logprobs", {"top_logprobs": 2, "logprobs": False}),
    ("max_completion_tokens", {"max_completion_tokens": 600}),
]


@pytest.mark.parametrize(
    "param,extra,chat",
    [(p, e, False) for p, e in REFUSED + REFUSED_COMPLETIONS]
    + [(p, e, True) for p, e in REFUSED + REFUSED_CHAT],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_refused_parameters_are_a_400_naming_them(client, param, extra, chat):
    with pytest.raises(openai.BadRequestError) as exc:
        if chat:
            client.chat.completions.create(
                model="tiny-gsm", messages=[{"role": "user", "content": Q}], extra_body=extra
            )
        else:
            client.completions.create(model="tiny-gsm", prompt=Q, extra_body=extra)
    err = exc.value.body
    assert err["param"] == param, err
    assert err["message"] and "\n" not in err["message"]


def test_neutral_values_of_unsupported_options_are_accepted(client):
    greedy = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=32).choices[0].text
    same = client.completions.create(
        model="tiny-gsm",
        prompt=Q,
        max_tokens=32,
        best_of=1,
        user="u1",
        extra_body={"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"},
    )
    assert same.choices[0].text == greedy


# ---------------------------------------------------------------------------------------------- supported
def greedy_ids(model, prompt, **settings):
    return model.generate(prompt, max_new_tokens=64, **settings).token_ids


def test_top_k_1_and_a_tiny_top_p_sample_greedily(client):
    greedy = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=48).choices[0].text
    for seed in (1, 2, 3):
        k1 = client.completions.create(
            model="tiny-gsm", prompt=Q, max_tokens=48, temperature=1.0, seed=seed, extra_body={"top_k": 1}
        )
        p0 = client.completions.create(
            model="tiny-gsm", prompt=Q, max_tokens=48, temperature=1.0, seed=seed, top_p=0.001
        )
        assert k1.choices[0].text == greedy == p0.choices[0].text


def test_ignore_eos_max_tokens_and_max_completion_tokens(client, model):
    natural = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=96)
    assert natural.choices[0].finish_reason == "stop" and natural.usage.completion_tokens < 60
    forced = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=60, extra_body={"ignore_eos": True}
    )
    assert forced.usage.completion_tokens == 60 and forced.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="tiny-gsm", messages=[{"role": "user", "content": Q}], max_completion_tokens=5, max_tokens=50
    )
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.content == model.decode_ids(greedy_ids(model, Q)[:5])


def test_stop_token_ids_end_the_text_at_that_token(client, model):
    ids = greedy_ids(model, Q)
    eq = model.encode("=")[0]
    assert eq in ids
    cut = ids[: ids.index(eq) + 1]
    out = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=64, extra_body={"stop_token_ids": [eq]}
    )
    assert out.choices[0].text == model.decode_ids(cut) and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == len(cut)


def test_min_tokens_holds_eos_back(client):
    natural = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=96)
    n = natural.usage.completion_tokens
    assert natural.choices[0].finish_reason == "stop" and n < 60
    held = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=96, extra_body={"min_tokens": n + 10}
    )
    assert held.usage.completion_tokens >= n + 10
    assert held.choices[0].text.startswith(natural.choices[0].text)  # greedy up to where EOS came


def test_logit_bias_forces_and_bans_tokens(client, model):
    seven = model.encode("7")[0]
    forced = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=12, logit_bias={str(seven): 100}
    )
    assert forced.choices[0].text == model.decode_ids([seven] * 12)
    first = greedy_ids(model, Q)[0]
    texts = []
    for s2 in ({"decoder": "ar"}, {"preset": "lossless"}, {}):
        banned = client.completions.create(
            model="tiny-gsm", prompt=Q, max_tokens=12, logit_bias={str(first): -100}, extra_body={"s2d2": s2}
        )
        texts.append(banned.choices[0].text)
    assert not texts[0].startswith(model.decode_ids([first]))
    assert texts[0] == texts[1] == texts[2]  # lossless against AR with the same bias


@pytest.mark.parametrize(
    "penalties",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 1.5},
        {"presence_penalty": 0.8, "frequency_penalty": 1.5},
    ],
    ids=["presence", "frequency", "both"],
)
def test_penalties_change_the_text_and_stay_lossless(url, client, penalties):
    """Greedy: lossless and the default equal AR with the same penalties. Sampled (same seeds, with and
    without the penalties): the penalised distribution gives other samples; ignoring the penalties
    would give the very same texts."""
    greedy = [
        client.completions.create(
            model="tiny-gsm", prompt=Q, max_tokens=48, extra_body={"s2d2": s2, **penalties}
        )
        .choices[0]
        .text
        for s2 in ({"decoder": "ar"}, {"preset": "lossless", "block_size": 8}, {})
    ]
    assert greedy[0] == greedy[1] == greedy[2]  # lossless against AR with the same penalties
    body = dict(prompt=SAMPLED, max_tokens=48, temperature=1.0, extra_body={"s2d2": {"decoder": "ar"}})
    seeds = range(8)
    plain = gather(*(complete(url, seed=s, **body) for s in seeds))
    body["extra_body"] = {**body["extra_body"], **penalties}
    penalised = gather(*(complete(url, seed=s, **body) for s in seeds))
    changed = sum(a.choices[0].text != b.choices[0].text for a, b in zip(plain, penalised, strict=True))
    assert changed >= 1


def test_completion_logprobs_are_the_ar_modes(client, model):
    out = client.completions.create(
        model="tiny-gsm", prompt=Q, max_tokens=48, logprobs=3, extra_body={"s2d2": {"preset": "lossless"}}
    )
    lp = out.choices[0].logprobs
    n = out.usage.completion_tokens
    assert lp is not None and len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == n
    assert "".join(lp.tokens).startswith(out.choices[0].text)
    assert lp.model_extra["token_sources"] == ["ar"] * n
    ids = greedy_ids(model, Q, preset="lossless")[:n]
    want = model.score([(model.encode(Q), ids)])[0].logprobs
    assert all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs, want, strict=True))
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 3 <= len(top) <= 4 and max(top.values()) >= chosen - 1e-6
    streamed = client.completions.create(
        model="tiny-gsm",
        prompt=Q,
        max_tokens=48,
        logprobs=3,
        stream=True,
        extra_body={"s2d2": {"preset": "lossless"}},
    )
    pieces = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    assert [t for p in pieces for t in p.token_logprobs] == lp.token_logprobs
    assert [o for p in pieces for o in p.text_offset] == lp.text_offset
    for s2, source in (({"decoder": "ar"}, "ar"), ({"decoder": "static", "block_size": 4}, "draft")):
        other = client.completions.create(
            model="tiny-gsm", prompt=Q, max_tokens=8, logprobs=0, extra_body={"s2d2": s2}
        )
        assert other.choices[0].logprobs.model_extra["token_sources"] == [source] * 8  # baselines: drafter's
    zero = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=8, logprobs=0)
    assert zero.choices[0].logprobs is not None and len(zero.choices[0].logprobs.token_logprobs) == 8
    assert all(len(t) == 1 for t in zero.choices[0].logprobs.top_logprobs)
    assert client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=8).choices[0].logprobs is None


def test_chat_logprobs_streamed_equal_non_streamed(client):
    kw = dict(
        model="tiny-gsm",
        messages=[{"role": "user", "content": Q}],
        max_tokens=32,
        logprobs=True,
        top_logprobs=2,
    )
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.model_extra["source"] in ("ar", "draft") for e in content)
    assert all(e.bytes == list(e.token.encode()) for e in content)
    streamed = [
        e
        for c in client.chat.completions.create(stream=True, **kw)
        for ch in c.choices
        if ch.logprobs
        for e in ch.logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_echo_returns_the_prompt_and_its_logprobs(client):
    plain = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16)
    echoed = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16, echo=True)
    assert echoed.choices[0].text == Q + plain.choices[0].text
    streamed = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text
    scored = client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=16, echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == scored.usage.prompt_tokens + scored.usage.completion_tokens
    assert lp.token_logprobs[0] is None and all(v is not None for v in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_acceptance_is_reported_and_a_pinned_strict_rule_is_flagged(client):
    def s2d2_of(**kw):
        return client.completions.create(model="tiny-gsm", prompt=Q, max_tokens=8, **kw).model_extra["s2d2"]

    assert s2d2_of(temperature=1.0, seed=1)["acceptance"] == "probabilistic"
    assert s2d2_of(temperature=1.0, seed=1)["notes"] == []
    assert s2d2_of()["acceptance"] == "strict" and s2d2_of()["notes"] == []
    pinned = s2d2_of(temperature=1.0, seed=1, extra_body={"s2d2": {"acceptance": "strict"}})
    assert pinned["acceptance"] == "strict" and pinned["notes"] == [STRICT_SAMPLING_NOTE]
    assert s2d2_of(temperature=1.0, seed=1, extra_body={"s2d2": {"decoder": "ar"}})["acceptance"] == "none"


# ---------------------------------------------------------------------------------------------- the rest
def test_fallback_chat_template_keeps_the_conversation(client, model):
    turns = [
        {"role": "system", "content": "You solve problems."},
        {"role": "user", "content": QUESTIONS[1]},
        {"role": "assistant", "content": "#### 3"},
        {"role": "user", "content": Q},
    ]
    text = fallback_chat_text([ChatMessage(**t) for t in turns])
    assert text == (
        f"System: You solve problems.\n\nUser: {QUESTIONS[1]}\n\nAssistant: #### 3\n\nUser: {Q}\n\nAssistant:"
    )
    # tiny-gsm's tokenizer cannot spell the role names (unknown words): the turns go bare, in order
    bare = fallback_chat_text([ChatMessage(**t) for t in turns], role_names=False)
    assert bare == f"You solve problems.\n\n{QUESTIONS[1]}\n\n#### 3\n\n{Q}"
    out = client.chat.completions.create(model="tiny-gsm", messages=turns, max_tokens=8)
    assert out.usage.prompt_tokens == len(encode_text(model, bare))
    alone = client.chat.completions.create(model="tiny-gsm", messages=turns[-1:], max_tokens=8)
    assert alone.usage.prompt_tokens == len(model.encode(Q))


def test_models_retrieve(client):
    assert client.models.retrieve("tiny-gsm").id == "tiny-gsm"
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("gpt-5")
    assert exc.value.body["param"] == "model"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_non_streamed_disconnect_aborts_without_a_traceback(url):
    """A client that gives up on a non-streamed request: its row is freed, nothing is logged."""
    body = {"prompt": Q, "max_tokens": 400, "s2d2": {"decoder": "ar", "ignore_eos": True}}
    seen = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "s2d2", "")]
    for lg in loggers:
        lg.addHandler(seen)
    try:
        # 400 AR tokens take about 0.4 s on an idle 2-core CPU: the client gives up well before
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.1))
        deadline = time.monotonic() + 10
        while metric(url, "s2d2_running_rows") != 0:
            assert time.monotonic() < deadline, "the disconnected request's row was not freed"
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        for lg in loggers:
            lg.removeHandler(seen)
    assert not [r for r in seen.records if r.exc_info], [r.getMessage() for r in seen.records]

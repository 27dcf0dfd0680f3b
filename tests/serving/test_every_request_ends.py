"""Every request ends (issue 60), through the official ``openai`` client against a real server: a
constraint the vocabulary cannot finish is a 400 naming its field, sampling under a choice never fails,
a regex's every alternative and a grammar hold on the decoded text, ``json_object`` gives objects, and
no output begins with a raw continuation piece."""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from structured_fixtures import make_json_model  # noqa: E402

BEN = "Ben has 3 apples. He buys 2 more. How many apples does Ben have?"
DECODERS = [{"decoder": "ar"}, {}, {"decoder": "dynamic"}, {"preset": "lossless"}]


@pytest.fixture(scope="module")
def client():
    model = s2d2.load("tiny-gsm", max_num_seqs=8)
    with running_server(create_app(model, max_num_seqs=8, max_queue=32)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=10)


@pytest.fixture(scope="module")
def json_model(tmp_path_factory):
    return s2d2.load(make_json_model(tmp_path_factory.mktemp("json_obj")), device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def json_bracket(json_model):
    return json_model.tokenizer.convert_tokens_to_ids("[")


@pytest.fixture(scope="module")
def json_client(json_model):
    with running_server(create_app(json_model, max_num_seqs=8, max_queue=32)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=30)


@pytest.mark.parametrize("field", ["guided_choice", "guided_regex"])
@pytest.mark.parametrize("settings", DECODERS)
def test_a_constraint_the_vocabulary_cannot_finish_is_a_400_at_once(client, field, settings):
    value = ["avocado"] if field == "guided_choice" else "avocado"
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="tiny-gsm", prompt=BEN, max_tokens=20, extra_body={field: value, "s2d2": settings}
        )
    assert time.monotonic() - t0 < 2.0
    body = err.value.body
    assert body["param"] == field and "cannot write any output" in body["message"]


def test_the_same_in_chat_and_streamed(client):
    msgs = [{"role": "user", "content": BEN}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            out = client.chat.completions.create(
                model="tiny-gsm", messages=msgs, max_tokens=20, stream=stream,
                extra_body={"guided_choice": ["avocado"], "s2d2": {"decoder": "ar"}},
            )  # fmt: skip
            list(out) if stream else None
        assert err.value.body["param"] == "guided_choice"


@pytest.mark.parametrize("settings", DECODERS)
def test_sampling_under_a_choice_gives_valid_outputs_for_every_seed(client, settings):
    options = ["apples", "bags", "boxes", "coins", "eggs"]
    texts = []
    for seed in range(8):
        out = client.completions.create(
            model="tiny-gsm", prompt=BEN, max_tokens=20, temperature=1.0, seed=seed,
            extra_body={"guided_choice": options, "s2d2": settings},
        )  # fmt: skip
        choice = out.choices[0]
        assert choice.text in options and choice.finish_reason == "stop"
        texts.append(choice.text)
    assert len(set(texts)) > 1  # the seeds draw different options
    one = client.completions.create(
        model="tiny-gsm", prompt=BEN, max_tokens=20, temperature=1.0, seed=1,
        extra_body={"guided_choice": ["12 apples"], "s2d2": settings},
    )  # fmt: skip
    assert one.choices[0].text == "12 apples"


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("guided_regex", "67|42", "67|42"),
        ("guided_regex", "apples|[0-9]+", "apples|[0-9]+"),
        ("guided_grammar", "root ::= [0-9]+", "[0-9]+"),
        ("guided_grammar", 'root ::= "apples" | [0-9] " " "apples"', "apples|[0-9] apples"),
    ],
)
@pytest.mark.parametrize("settings", [{"decoder": "ar"}, {}])
def test_regex_alternatives_and_grammars_hold_on_the_text(client, field, value, pattern, settings):
    seen = set()
    for seed, temperature in [(0, 0.0), *[(s, 1.0) for s in range(6)]]:
        out = client.completions.create(
            model="tiny-gsm", prompt=BEN, max_tokens=12, temperature=temperature, seed=seed,
            extra_body={field: value, "s2d2": settings},
        )  # fmt: skip
        text, finish = out.choices[0].text, out.choices[0].finish_reason
        assert finish in ("stop", "length")
        if finish == "stop":  # (at the length limit: a prefix of a match, cut there)
            assert re.fullmatch(pattern, text), text
            seen.add(text)
    assert seen


@pytest.mark.parametrize("regex", ["67|42", "42|67", "(67)|42|5"])
@pytest.mark.parametrize("settings", [{"decoder": "ar"}, {}, {"preset": "lossless"}])
def test_every_alternative_of_a_regex_is_written_whole(client, regex, settings):
    """Each alternative in turn, its first digit favoured by ``logit_bias`` (digit d is token 5 + d)."""
    for alternative in regex.replace("(", "").replace(")", "").split("|"):
        out = client.completions.create(
            model="tiny-gsm", prompt=BEN, max_tokens=8, logit_bias={str(5 + int(alternative[0])): 100},
            extra_body={"guided_regex": regex, "s2d2": settings},
        )  # fmt: skip
        assert out.choices[0].text == alternative and re.fullmatch(regex, out.choices[0].text)
        assert out.choices[0].finish_reason == "stop"


def test_json_object_gives_objects(json_client, json_bracket):
    """20 of 20 objects, even where the model leans towards an array (its ``[`` token favoured)."""
    name = json_client.models.list().data[0].id
    for seed in range(20):
        out = json_client.completions.create(
            model=name, prompt="user ab 3", max_tokens=40, temperature=1.0, seed=seed,
            logit_bias={str(json_bracket): 8}, extra_body={"response_format": {"type": "json_object"}},
        )  # fmt: skip
        text = out.choices[0].text
        assert text.startswith("{"), text  # an object from its first character (never an array)
        if out.choices[0].finish_reason == "stop":  # (else cut at max_tokens inside the object)
            assert isinstance(json.loads(text), dict)


def test_no_output_begins_with_a_raw_continuation_piece(client):
    for prompt in ["1 + 1", "1 + 1 =", "2"]:
        out = client.completions.create(
            model="tiny-gsm", prompt=prompt, max_tokens=6, logprobs=2, extra_body={"s2d2": {"decoder": "ar"}}
        )
        lp = out.choices[0].logprobs
        assert not out.choices[0].text.startswith("@@")
        assert not lp.tokens[0].startswith("@@")
        assert not any(k.startswith("@@") for k in lp.top_logprobs[0])


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"ignore_eos": True}, "ignore_eos"), ({"s2d2": {"ignore_eos": True}}, "s2d2.ignore_eos")],
)
def test_a_setting_a_constraint_cannot_honour_is_named(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="tiny-gsm", prompt=BEN, max_tokens=8, extra_body={"guided_regex": "[0-9]+", **extra}
        )
    assert err.value.body["param"] == param and "guided_regex" in err.value.body["message"]


def test_a_request_that_cannot_end_is_a_422_with_its_reason(client, monkeypatch):
    """A row that commits nothing (its step frozen) fails alone after the no-progress bound: the client
    reads why, in a 422, not a 500 "internal error"; the next request decodes as usual."""
    from s2d2.engine.step import postprocess as llm_engine
    from s2d2.engine.step.progress import NO_PROGRESS_FORWARDS

    real = llm_engine.apply
    monkeypatch.setattr(llm_engine, "apply", lambda w: None if w.req.cursor.ids is not None else real(w))
    monkeypatch.setattr(llm_engine.Lanes, "take", lambda self, req, lg, fwd: False)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model="tiny-gsm", prompt=BEN, max_tokens=8)
    assert err.value.status_code == 422 and err.value.body["code"] == "cannot_end"
    assert f"no progress in {NO_PROGRESS_FORWARDS} forwards" in err.value.body["message"]
    monkeypatch.undo()
    assert client.completions.create(model="tiny-gsm", prompt=BEN, max_tokens=8).choices[0].text

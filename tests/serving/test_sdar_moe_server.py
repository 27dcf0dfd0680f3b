"""``s2d2 serve --model <an SDAR-MoE checkpoint>``: a real server process on 127.0.0.1, driven by the
official ``openai`` client, serves the family like any other: the text of the in-process ``s2d2`` model
(lossless == AR over HTTP, streamed the same), structured output (a JSON schema), and prompt scoring
(``echo`` with ``logprobs``: ``model.score``'s AR-mode logprobs)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import free_port, start_server  # noqa: E402

import s2d2  # noqa: E402
from sdar_moe_fixture import make_sdar_moe_with_tokenizer  # noqa: E402
from structured_fixtures import SCHEMAS  # noqa: E402

PROMPTS = ["user ab 3", "color red tags", "Ann"]
SETTINGS = ({"decoder": "ar"}, {"preset": "lossless", "block_size": 4}, {"preset": "lossless-fused"})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_sdar_moe_with_tokenizer(tmp_path_factory.mktemp("sdar_moe_server"))


@pytest.fixture(scope="module")
def model(checkpoint):
    return s2d2.load(checkpoint, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def client(checkpoint):
    port = free_port()
    proc = start_server(port, "--model", str(checkpoint), "--device", "cpu", "--dtype", "fp32")
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_server_serves_the_model_and_lossless_equals_ar(client, model, checkpoint):
    assert model.info.family == "sdar_moe"
    [served] = client.models.list().data
    for prompt in PROMPTS:
        want = model.generate(prompt, decoder="ar", max_new_tokens=16, ignore_eos=True).text
        for settings in SETTINGS:
            body = {"s2d2": {**settings, "ignore_eos": True}}
            out = client.completions.create(model=served.id, prompt=prompt, max_tokens=16, extra_body=body)
            assert out.choices[0].text == want, settings
        stream = client.completions.create(
            model=served.id, prompt=prompt, max_tokens=16, stream=True,
            extra_body={"s2d2": {"preset": "lossless", "ignore_eos": True}},
        )  # fmt: skip
        assert "".join(c.choices[0].text for c in stream if c.choices) == want


def test_structured_output(client, model):
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    schema = SCHEMAS["nested"]
    fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": schema}}
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt="user ab 3", max_tokens=64,
        extra_body={"s2d2": {"preset": "lossless"}, "response_format": fmt},
    )  # fmt: skip
    text = out.choices[0].text
    jsonschema.validate(json.loads(text), schema)
    assert text == model.generate("user ab 3", json_schema=schema, max_new_tokens=64, preset="lossless").text


def test_echo_scores_the_prompt_as_the_api_does(client, model):
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt=PROMPTS, max_tokens=0, echo=True, logprobs=1
    )
    for prompt, choice in zip(PROMPTS, sorted(out.choices, key=lambda c: c.index), strict=True):
        ids = model.encode(prompt)
        [want] = model.score([(ids[:1], ids[1:])], top_logprobs=1)
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(want.logprobs, abs=1e-5)

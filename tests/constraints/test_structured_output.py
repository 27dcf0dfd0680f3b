"""Structured output (issue 51): grammar-masked drafting and verification.

A byte-level BPE tokenizer is trained here and paired with a random SDAR-format model. Every output of 5
JSON schemas x 40 prompts parses and validates; the lossless presets equal constrained AR greedy (the
``ar`` decoder under the same grammar) token for token; a seeded sampled request is the same alone and in
a batch; non-lossless decoders conform too.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

import s2d2  # noqa: E402
from s2d2.errors import ConfigError  # noqa: E402
from structured_fixtures import SCHEMAS, make_json_model  # noqa: E402

PROMPTS = [f"item {i}: {'ab' * (i % 5)} {i * 7 % 13}" for i in range(40)]
MAX_NEW = 64


@pytest.fixture(scope="module")
def json_model(tmp_path_factory):
    path = make_json_model(tmp_path_factory.mktemp("json_model"))
    return s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=40)


def _batch(model, schema, **settings):
    return model.generate_batch(PROMPTS, json_schema=schema, max_new_tokens=MAX_NEW, **settings)


@pytest.fixture(scope="module")
def ar_outputs(json_model):
    return {name: _batch(json_model, schema, decoder="ar") for name, schema in SCHEMAS.items()}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_constrained_ar_outputs_parse_and_validate(json_model, ar_outputs, name):
    for res in ar_outputs[name]:
        assert res.stats.finish_reason == "stop", res.text
        jsonschema.validate(json.loads(res.text), SCHEMAS[name])


@pytest.mark.parametrize("preset", ["lossless", "lossless-fused", "lossless-auto"])
def test_lossless_presets_equal_constrained_ar(json_model, ar_outputs, preset):
    for name, schema in SCHEMAS.items():
        got = _batch(json_model, schema, preset=preset)
        for ref, res in zip(ar_outputs[name], got, strict=True):
            assert res.token_ids == ref.token_ids, (preset, name, res.text, ref.text)
            jsonschema.validate(json.loads(res.text), schema)


def test_the_grammar_changes_the_output(json_model, ar_outputs):
    """The random model writes no JSON by itself: the masks are what make the outputs conform."""
    free = json_model.generate_batch(PROMPTS[:8], decoder="ar", max_new_tokens=MAX_NEW)
    for res in free:
        with pytest.raises(ValueError):
            json.loads(res.text)


@pytest.mark.parametrize("decoder", ["dynamic", "static"])
def test_non_lossless_decoders_conform(json_model, decoder):
    for schema in SCHEMAS.values():
        for res in _batch(json_model, schema, decoder=decoder, block_size=4, threshold=0.5):
            assert res.stats.finish_reason == "stop", res.text
            jsonschema.validate(json.loads(res.text), schema)


def test_threshold_s2d2_conforms(json_model):
    schema = SCHEMAS["nested"]
    for res in _batch(json_model, schema, decoder="s2d2", policy="score", causal_cache=True):
        jsonschema.validate(json.loads(res.text), schema)


def test_seeded_sampled_request_is_the_same_alone_and_in_a_batch(json_model):
    schema = SCHEMAS["optional"]
    settings = dict(preset="lossless", temperature=1.0, max_new_tokens=MAX_NEW)
    alone = json_model.generate(PROMPTS[3], json_schema=schema, seed=11, **settings)
    jsonschema.validate(json.loads(alone.text), schema)
    per = [{"seed": 100 + i} for i in range(8)]
    per[5] = {"seed": 11}
    batch = json_model.generate_batch(
        [PROMPTS[i] if i != 5 else PROMPTS[3] for i in range(8)],
        json_schema=schema,
        per_request=per,
        **settings,
    )
    assert batch[5].token_ids == alone.token_ids
    for res in batch:
        jsonschema.validate(json.loads(res.text), schema)


def test_regex_and_choice(json_model):
    res = json_model.generate_batch(PROMPTS[:6], regex=r"#### -?[0-9]{1,4}", max_new_tokens=16)
    for r in res:
        assert r.text.startswith("#### ") and r.text[5:].lstrip("-").isdigit(), r.text
    options = ["red", "blue", "green apple"]
    for r in json_model.generate_batch(PROMPTS[:6], choice=options, preset="lossless", max_new_tokens=16):
        assert r.text in options


def test_response_format_json_object(json_model):
    res = json_model.generate(
        PROMPTS[0], response_format={"type": "json_object"}, preset="lossless", max_new_tokens=MAX_NEW
    )
    if res.stats.finish_reason == "stop":
        assert isinstance(json.loads(res.text), dict)
    else:
        assert res.text.startswith("{")


def test_one_compile_per_schema(json_model):
    """Requests with an equal schema share one compiled grammar: a long run compiles nothing new."""
    schema = SCHEMAS["array"]
    json_model.generate(PROMPTS[0], json_schema=schema, max_new_tokens=8)
    before = json_model._grammars.compiles
    json_model.generate_batch(PROMPTS[:10], json_schema=schema, max_new_tokens=MAX_NEW, preset="lossless")
    assert json_model._grammars.compiles == before


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"json_schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "nonsense"),
        ({"json_schema": "{not json"}, "not valid JSON"),
        ({"regex": "([a"}, "invalid regex"),
        ({"grammar": "root ::= ("}, "invalid grammar"),
        ({"choice": []}, "at least one"),
        ({"regex": "a", "choice": ["a"]}, "at most one"),
        ({"response_format": {"type": "yaml"}}, "not supported"),
        ({"regex": "a+", "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_bad_constraints_are_one_line_errors(json_model, kwargs, words):
    with pytest.raises(ConfigError, match=words) as info:
        json_model.generate(PROMPTS[0], max_new_tokens=8, **kwargs)
    assert "\n" not in str(info.value)


def test_cli_json_schema_regex_and_request_file(json_model, tmp_path, capsys):
    from conftest import assert_one_line_error, run_cli

    path = str(json_model.path)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS["enum"]))
    common = ["--model", path, "--device", "cpu", "--max-new-tokens", str(MAX_NEW)]
    code, out, _ = run_cli(capsys, "generate", PROMPTS[1], *common, "--json-schema", str(schema), "--json")
    assert code == 0
    want = json_model.generate(PROMPTS[1], json_schema=SCHEMAS["enum"], max_new_tokens=MAX_NEW)
    assert json.loads(out)["token_ids"] == want.token_ids
    code, out, _ = run_cli(capsys, "generate", PROMPTS[1], *common, "--regex", "[0-9]{3}", "--json")
    assert code == 0 and len(json.loads(out)["text"]) == 3
    code, _, err = run_cli(capsys, "generate", PROMPTS[1], *common, "--regex", "([a")
    assert_one_line_error(code, err, "invalid regex")
    lines = [
        {"prompt": PROMPTS[2], "json_schema": SCHEMAS["bounds"]},
        {"prompt": PROMPTS[3], "choice": ["red", "blue"]},
        {"prompt": PROMPTS[4], "json_schema": "{bad"},
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, _, _ = run_cli(
        capsys, "generate", *common, "--input", str(src), "--output", str(dst), "--no-progress"
    )
    assert code == 1  # the third line fails alone
    got = [json.loads(x) for x in dst.read_text().splitlines()]
    jsonschema.validate(json.loads(got[0]["text"]), SCHEMAS["bounds"])
    assert got[1]["text"] in ("red", "blue")
    assert "not valid JSON" in got[2]["error"]

"""A byte-level BPE tokenizer trained here and a random SDAR-format model over its vocabulary: a model
whose vocabulary can write JSON (braces, quotes), for the structured-output tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from conftest import make_random_sdar

EOS, MASK = "<|eos|>", "<|mask|>"

#: Five JSON schemas: nested objects, arrays, enums, bounded numbers, optional fields.
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 5},
                    "id": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "id"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 4},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "blue", "green"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "level": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["age", "level"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "string", "maxLength": 3},
            "c": {"type": "boolean"},
        },
        "required": ["a"],
        "additionalProperties": False,
    },
}


def _corpus():
    rng = random.Random(0)
    words = [
        "name",
        "age",
        "tags",
        "color",
        "user",
        "id",
        "ok",
        "true",
        "false",
        "red",
        "blue",
        "green",
        "Ann",
    ]
    for _ in range(300):
        key = rng.choice(words)
        value = rng.choice(
            [rng.randint(-9, 99), rng.choice(words), [rng.choice(words)], {"id": rng.randint(0, 9)}]
        )
        yield json.dumps({key: value})
        yield " ".join(rng.choice(words) for _ in range(6))


def make_json_model(directory: Path, *, seed: int = 0) -> Path:
    """Train a ~320-token byte-level BPE tokenizer and write a random SDAR model over it (EOS and MASK are
    its last two ids, as :func:`conftest.make_random_sdar` expects)."""
    directory.mkdir(parents=True, exist_ok=True)
    make_random_sdar(directory, vocab=write_json_tokenizer(directory), seed=seed)
    return directory


def write_json_tokenizer(directory: Path) -> int:
    """Train the ~320-token byte-level BPE tokenizer into ``directory`` (``tokenizer.json`` and
    ``tokenizer_config.json``; EOS and MASK are its last two ids); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_special_tokens([EOS, MASK])
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "mask_token": MASK}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.get_vocab_size()

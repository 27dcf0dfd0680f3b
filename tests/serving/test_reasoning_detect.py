"""The reasoning parser detected from a chat template: Qwen3-style templates (SDAR's published one) get
``qwen3``; LLaDA2's (``detailed thinking off``) and templates without ``<think>`` get none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from s2d2.serving.reasoning.detect import detect_reasoning_parser

PUBLISHED = Path("/work/shared/fixtures/published")


def _template(folder: str) -> str:
    path = PUBLISHED / folder / "tokenizer_config.json"
    if not path.is_file():
        pytest.skip(f"published side files absent: {path}")
    return json.loads(path.read_text())["chat_template"]


def test_sdar_published_template_gets_qwen3() -> None:
    assert detect_reasoning_parser(_template("SDAR-4B-Chat")) == "qwen3"


def test_llada2_published_template_gets_none() -> None:
    template = _template("LLaDA2.1-mini")
    assert "<think>" in template  # it mentions think blocks, yet its model never thinks
    assert detect_reasoning_parser(template) is None


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, None),
        ("", None),
        ("{{ messages[0].content }}", None),
        ("{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}", "qwen3"),
        ("{{- 'detailed thinking off' }}{{- '<think>' }}", None),
    ],
)
def test_small_templates(template: str | None, expected: str | None) -> None:
    assert detect_reasoning_parser(template) == expected

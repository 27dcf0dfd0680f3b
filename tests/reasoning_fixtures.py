"""A model for the reasoning tests: a random SDAR network over a byte-level tokenizer that has Qwen3's
``<think>`` / ``</think>`` / ``<tool_call>`` / ``<|im_start|>`` / ``<|im_end|>`` tokens, with the
published SDAR chat template (Qwen3's: ``<think>``, ``enable_thinking``, ``<tool_call>``) read from the
published side files. :func:`published_sdar` is that folder, or a skip saying it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import PUBLISHED, make_random_sdar
from structured_fixtures import EOS, MASK
from tool_fixtures import _add_call_token, _save, _trained

PUBLISHED_SDAR = PUBLISHED / "SDAR-4B-Chat"
#: Qwen3's tokens the published template writes or the model writes (none of them special there)
QWEN_TOKENS = ["<think>", "</think>", "<|im_start|>", "<|im_end|>"]


def published_sdar() -> Path:
    """The published SDAR-4B-Chat side files, or a skip with the reason."""
    if not (PUBLISHED_SDAR / "chat_template.jinja").is_file():
        pytest.skip(f"the published side files are absent ({PUBLISHED_SDAR})")
    return PUBLISHED_SDAR


def make_thinking_model(directory: Path, *, seed: int = 0) -> Path:
    """A random SDAR model (tokenizer of ~325 tokens, EOS and MASK last) with the published template."""
    from tokenizers import AddedToken

    template = (published_sdar() / "chat_template.jinja").read_text()
    tok = _trained(320)
    _add_call_token(tok)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_TOKENS])
    tok.add_special_tokens([EOS, MASK])
    make_random_sdar(directory, vocab=tok.get_vocab_size(), seed=seed, max_positions=2048)
    return _save(tok, directory, template)

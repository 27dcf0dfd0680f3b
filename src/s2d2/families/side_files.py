"""The small files beside a checkpoint's weights, read without transformers and without the weights.

``config.json``, ``generation_config.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
``added_tokens.json``, ``tokenizer.json``'s added tokens and ``chat_template.jinja``: what s2d2 needs to
know about a checkpoint before (or instead of) loading it. A missing side file reads as empty; a broken
one is a one-line :class:`~s2d2.errors.ModelLoadError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .checkpoint import read_config

#: Roles of the special tokens a tokenizer names by text (``eos_token``...), each with its config id key.
TOKEN_ROLES = ("eos", "bos", "pad", "mask", "unk")


@dataclass
class SideFiles:
    """What a checkpoint directory's side files say (empty where a file is absent)."""

    path: Path
    config: dict[str, Any]
    generation_config: dict[str, Any] = field(default_factory=dict)
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    special_tokens_map: dict[str, Any] = field(default_factory=dict)
    #: token text -> id: ``tokenizer.json``'s added tokens, ``tokenizer_config.json``'s
    #: ``added_tokens_decoder`` and ``added_tokens.json`` (all of them: they may spell a token differently)
    added_tokens: dict[str, int] = field(default_factory=dict)
    chat_template: str | None = None

    def special_token(self, role: str) -> str | None:
        """The text of the tokenizer's ``role`` token (``eos``, ``mask``...), from ``tokenizer_config.json``
        or ``special_tokens_map.json``; None where neither names one."""
        for source in (self.tokenizer_config, self.special_tokens_map):
            value = source.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and value:
                return value
        return None

    def token_id(self, text: str) -> int | None:
        """The id of token ``text``: an added token, or the id the config gives a role whose token the
        tokenizer spells ``text`` (LLaDA2.x's ``<|endoftext|>`` is its ``pad_token`` and ``pad_token_id``)."""
        if text in self.added_tokens:
            return self.added_tokens[text]
        for role in TOKEN_ROLES:
            if self.special_token(role) == text:
                for source in (self.config, self.generation_config):
                    got = source.get(f"{role}_token_id")
                    if isinstance(got, int):
                        return got
        return None


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def _added_tokens(path: Path, tokenizer_config: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        for tok in read_json(path / "tokenizer.json").get("added_tokens", []):
            found[tok["content"]] = int(tok["id"])
        for key, tok in (tokenizer_config.get("added_tokens_decoder") or {}).items():
            found.setdefault(tok["content"], int(key))
        for text, tid in read_json(path / "added_tokens.json").items():
            found.setdefault(text, int(tid))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"{path}: the added tokens are not a valid token map ({exc})") from None
    return found


def read_side_files(path: Path) -> SideFiles:
    """The side files of checkpoint directory ``path`` (``config.json`` required)."""
    config = read_config(path)
    tok_cfg = read_json(path / "tokenizer_config.json")
    template = path / "chat_template.jinja"
    chat_template = tok_cfg.get("chat_template")
    if template.is_file():
        chat_template = template.read_text(encoding="utf-8")
    return SideFiles(
        path=path,
        config=config,
        generation_config=read_json(path / "generation_config.json"),
        tokenizer_config=tok_cfg,
        special_tokens_map=read_json(path / "special_tokens_map.json"),
        added_tokens=_added_tokens(path, tok_cfg),
        chat_template=chat_template if isinstance(chat_template, str) else None,
    )

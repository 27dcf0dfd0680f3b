"""A checkpoint's tokenizer, loaded without remote code, and text that never becomes the mask token.

:func:`load_tokenizer` loads the class ``tokenizer_config.json`` names (``tokenizer_class``) straight from
transformers, so neither an ``auto_map`` (remote code) nor the model's ``config.json`` is read and nothing
asks on stdin; a tokenizer whose class transformers lacks goes through ``AutoTokenizer`` with
``trust_remote_code=False``.

Special-token text in a prompt is ordinary text (as SGLang reads it): :func:`text_ids` splits it, so
``"a <|MASK|> b"`` is a prompt like any other. A chat template writes its own control tokens as text, so a
rendered conversation keeps them special; :func:`without_mask` then spells any mask token in it as the
ordinary text of the mask token's name, so the mask id never comes from text.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _named_class(path: Path) -> Any | None:
    """The transformers class ``tokenizer_config.json`` names, or None (absent, or not in transformers)."""
    cfg = path / "tokenizer_config.json"
    try:
        name = json.loads(cfg.read_text(encoding="utf-8")).get("tokenizer_class") if cfg.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    if not isinstance(name, str):
        return None
    import transformers

    try:
        return getattr(transformers, name, None)
    except Exception:  # a lazy transformers attribute whose backend is missing
        return None


def load_tokenizer(path: Path) -> Any | None:
    """The directory's tokenizer through transformers (never remote code), or None if it has none."""
    if not any((path / f).is_file() for f in _FILES):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    cls = _named_class(path)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # AutoTokenizer reads config.json and warns about the unknown model_type
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if cls is not None:
                return cls.from_pretrained(str(path))
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # tokenizers raise many types; the user needs one line
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def text_ids(tokenizer: Any, text: str, **options: Any) -> Any:
    """``tokenizer(text, add_special_tokens=False, **options)`` with special-token text read as ordinary
    text (the encoding, ``input_ids`` and any offsets)."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True, **options)


def without_mask(tokenizer: Any, ids: Sequence[int], mask_id: int) -> list[int]:
    """``ids`` with each ``mask_id`` replaced by the ordinary-text ids of the mask token's name."""
    ids = [int(i) for i in ids]
    if mask_id not in ids:
        return ids
    name = tokenizer.convert_ids_to_tokens(mask_id)
    spelled = [int(i) for i in text_ids(tokenizer, name)["input_ids"]]
    out: list[int] = []
    for i in ids:
        out.extend(spelled if i == mask_id else [i])
    return out

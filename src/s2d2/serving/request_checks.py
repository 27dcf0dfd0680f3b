"""Checks on a request body before anything tokenises it (run off the event loop, as tokenising).

* **Known fields.** A field no request model declares (:func:`.protocol.unknown_fields`) is a 400 naming
  every such field, as OpenAI's API answers (:func:`check_known_fields`); nothing is silently dropped.
* **Valid Unicode.** JSON may spell lone UTF-16 surrogates (``"\\ud800"``); Python decodes them into a
  ``str`` no tokenizer, detokenizer or JSON encoder accepts. Any text field holding one is a 400 naming
  the field (:func:`check_unicode`).
* **Prompts certainly over the context.** A prompt whose text is longer than ``max_length`` x
  :data:`MAX_CHARS_PER_TOKEN` characters is refused unseen (:func:`check_prompt_chars`): no text a
  tokenizer meets in practice packs more characters into each token, so tokenising it would only
  confirm that it does not fit (a multi-megabyte prompt would occupy a worker for seconds to say so).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from .errors import bad_request, unknown_arguments
from .openai_fields import unsupported
from .protocol import unknown_fields

#: Characters per token no real text exceeds on average (English BPE: about 4; the longest tokens of
#: common vocabularies: 16 to 30).
MAX_CHARS_PER_TOKEN = 32


def _texts(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string inside ``value`` (a pydantic model, list, dict or scalar) with its field path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _texts(getattr(value, name), f"{path}.{name}" if path else name)
        for name, extra in (value.model_extra or {}).items():
            yield from _texts(extra, f"{path}.{name}" if path else name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(key, path)
            yield from _texts(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _texts(item, f"{path}.{i}" if path else str(i))


def check_known_fields(body: BaseModel) -> None:
    """A 400 (``unsupported_parameter``) naming OpenAI's documented fields the server does not support
    (:mod:`.openai_fields`), else one (``unknown_parameter``) naming the fields of ``body`` that no
    request model declares."""
    refused = unsupported(body)
    if refused:
        raise bad_request(
            f"{', '.join(refused)} {'are' if len(refused) > 1 else 'is'} not supported by this server",
            param=refused[0],
            code="unsupported_parameter",
        )
    names = unknown_fields(body)
    if names:
        raise unknown_arguments(names)


def check_unicode(body: BaseModel) -> None:
    """A 400 naming the first text field that is not valid Unicode (a lone surrogate)."""
    for path, text in _texts(body, ""):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(
                f"{path} is not valid Unicode (it holds a lone surrogate)", param=path, code="invalid_unicode"
            ) from None


def prompt_chars(body: BaseModel) -> tuple[str, int]:
    """The prompt's field (``prompt`` or ``messages``) and its text's length in characters."""
    if hasattr(body, "messages"):
        return "messages", sum(len(t) for _, t in _texts(body.messages, "messages"))
    return "prompt", sum(len(t) for _, t in _texts(getattr(body, "prompt", None), "prompt"))


def check_prompt_chars(body: BaseModel, max_length: int) -> None:
    """A 400 (``context_length_exceeded``) for a prompt certainly over ``max_length`` tokens."""
    param, chars = prompt_chars(body)
    limit = max_length * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise bad_request(
            f"the {param} text has {chars} characters, certainly more than the model's context of "
            f"{max_length} tokens (at most {limit} characters are read)",
            param=param,
            code="context_length_exceeded",
        )


def check_body_text(body: BaseModel, max_length: int) -> None:
    """The checks of the module docstring; raises a 400 :class:`~.errors.APIError`."""
    check_known_fields(body)
    check_unicode(body)
    check_prompt_chars(body, max_length)


__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "check_body_text",
    "check_known_fields",
    "check_prompt_chars",
    "check_unicode",
]

"""Chat messages to prompt token ids: the tokenizer's chat template, or the server's fallback.

A tokenizer with a ``chat_template`` renders the conversation itself. The built-in ``tiny-gsm`` model was
trained on bare questions and its tokenizer files ship no template, so for a tokenizer without one the
server renders the conversation as the text of its user messages joined by newlines (system, developer
and assistant turns are not shown to the model). This fallback lives here, in the serving layer; the
shipped model files are not changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from .errors import bad_request
from .protocol import ChatMessage

#: Roles whose text the fallback template shows the model.
FALLBACK_ROLES = ("user",)


def encode_text(model: Any, text: str) -> list[int]:
    """``model.encode(text)`` without its per-prompt warnings (a server would print one per request)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.encode(text)


def fallback_chat_text(messages: Sequence[ChatMessage]) -> str:
    """The fallback template: the user messages' text, joined by newlines."""
    parts = [m.text() for m in messages if m.role in FALLBACK_ROLES]
    if not parts:
        raise bad_request("messages must contain at least one user message", param="messages")
    return "\n".join(parts)


def chat_prompt_ids(model: Any, messages: Sequence[ChatMessage]) -> list[int]:
    """Token ids of the conversation, ending where the assistant's reply begins."""
    tok = model.tokenizer
    if tok is None:
        raise bad_request(
            f"model {model.name} has no tokenizer: use /v1/completions with token ids", param="messages"
        )
    if getattr(tok, "chat_template", None):
        conv = [{"role": m.role, "content": m.text()} for m in messages]
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return encode_text(model, fallback_chat_text(messages))

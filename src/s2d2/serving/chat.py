"""Chat messages to prompt token ids: the tokenizer's chat template, or the server's fallback.

A tokenizer with a ``chat_template`` renders the conversation itself. For a tokenizer without one (the
built-in ``tiny-gsm`` model was trained on bare questions and ships none) the server's fallback keeps
the whole conversation in order: each turn on its own lines as ``Role: text`` (System, Developer, User,
Assistant, Tool), turns separated by a blank line, ending with ``Assistant:`` where the reply begins. A
conversation of one user message is sent as its bare text (there is nothing to delimit, and it is the
form such a model was trained on). This fallback lives here, in the serving layer; the shipped model
files are not changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from .errors import bad_request
from .protocol import ChatMessage

#: How the fallback template names each role.
ROLE_NAMES = {
    "system": "System",
    "developer": "Developer",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}


def encode_text(model: Any, text: str) -> list[int]:
    """``model.encode(text)`` without its per-prompt warnings (a server would print one per request)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.encode(text)


def fallback_chat_text(messages: Sequence[ChatMessage]) -> str:
    """The fallback template (see the module docstring)."""
    if not any(m.role == "user" for m in messages):
        raise bad_request("messages must contain at least one user message", param="messages")
    if len(messages) == 1:
        return messages[0].text()
    turns = [f"{ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
    return "\n\n".join([*turns, f"{ROLE_NAMES['assistant']}:"])


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

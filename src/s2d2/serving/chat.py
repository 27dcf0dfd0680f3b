"""Chat messages to prompt token ids: the tokenizer's chat template, or the server's fallback.

A tokenizer with a ``chat_template`` renders the conversation itself. For a tokenizer without one the
server's fallback keeps the whole conversation in order, turns separated by a blank line:

- each turn as ``Role: text`` (System, Developer, User, Assistant, Tool), ending with ``Assistant:`` where
  the reply begins, when the tokenizer can spell those role names;
- the turns' bare texts, when it cannot: a role name it reads as its unknown token is noise the model
  never saw (the built-in ``tiny-gsm`` tokenizer knows none of them), and the reply begins right after
  the last turn, where such a model's training put its answers.

A conversation of one user message is sent as its bare text (there is nothing to delimit, and it is the
form such a model was trained on). A model without a template was seldom trained on conversations at all:
``tiny-gsm`` was trained on single word problems, so earlier turns put it outside what it learned, and a
turn that is no word problem of its domain ("Now double it.") is answered with an immediate end of
sequence (an empty reply), as the same message alone is. A response to a conversation the fallback
rendered carries :data:`FALLBACK_NOTE` in its ``s2d2.notes``. This fallback lives here, in the serving
layer; the shipped model files are not changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from ..families.tokenizer import without_mask
from .errors import bad_request
from .protocol import ChatMessage
from .served_model import ServedModel
from .tools.formats import ToolFormat
from .tools.render import apply_template, fallback_text, template_message

#: apply_chat_template arguments the server sets itself (never taken from ``chat_template_kwargs``)
_TEMPLATE_OWN = {
    "conversation", "add_generation_prompt", "tokenize", "return_dict", "return_tensors", "tools",
}  # fmt: skip
#: template variables that would replace the conversation the server renders (a 400 when given)
_CONVERSATION_KEYS = {"messages", "conversation"}
#: How the fallback template names each role.
ROLE_NAMES = {
    "system": "System",
    "developer": "Developer",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}
FALLBACK_NOTE = (
    "the model has no chat template: the server's fallback joined the turns in order (see the serving "
    "docs); a model trained on single prompts may answer a conversation poorly or not at all"
)


def encode_text(model: ServedModel, text: str) -> list[int]:
    """``model.encode(text)`` without its per-prompt warnings (a server would print one per request)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.encode(text)


UNKNOWN_WORDS_NOTE = (
    "the prompt holds words outside the model's vocabulary, read as its unknown token: the answer is "
    "unlikely to mean anything, and with echo the prompt's text and text_offsets are of the decoded "
    "prompt (each such word shown as the unknown token)"
)


def unknown_words_notes(model: ServedModel, prompts: Sequence[Sequence[int]]) -> list[str]:
    """``[UNKNOWN_WORDS_NOTE]`` when a prompt holds the tokenizer's unknown token, else ``[]``."""
    unk = getattr(model.tokenizer, "unk_token_id", None)
    return [UNKNOWN_WORDS_NOTE] if unk is not None and any(unk in p for p in prompts) else []


def spells_role_names(model: ServedModel) -> bool:
    """Whether ``model``'s tokenizer reads every fallback role name without its unknown token."""
    unk = getattr(model.tokenizer, "unk_token_id", None)
    return unk is None or unk not in encode_text(model, " ".join(f"{n}:" for n in ROLE_NAMES.values()))


def fallback_chat_text(
    messages: Sequence[ChatMessage],
    *,
    role_names: bool = True,
    tools: list[dict[str, Any]] | None = None,
    fmt: ToolFormat | None = None,
) -> str:
    """The fallback template (see the module docstring); ``role_names``: the labelled form; ``tools``
    (with their ``fmt``): described in a system turn first (:mod:`.tools.render`)."""
    if not any(m.role == "user" for m in messages):
        raise bad_request("messages must contain at least one user message", param="messages")
    texts = [fallback_text(m, fmt) for m in messages]
    roles = [m.role for m in messages]
    if tools and fmt is not None:
        texts, roles = [fmt.instructions(tools), *texts], ["system", *roles]
    if len(texts) == 1:
        return texts[0]
    if not role_names:
        return "\n\n".join(texts)
    turns = [f"{ROLE_NAMES[r]}: {t}" for r, t in zip(roles, texts, strict=True)]
    return "\n\n".join([*turns, f"{ROLE_NAMES['assistant']}:"])


def uses_fallback(model: ServedModel, messages: Sequence[ChatMessage]) -> bool:
    """Whether the fallback renders ``messages`` as a conversation (no chat template, several turns)."""
    return not getattr(model.tokenizer, "chat_template", None) and len(messages) > 1


def chat_prompt_ids(
    model: ServedModel,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    fmt: ToolFormat | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the conversation, ending where the assistant's reply begins; ``tools`` (with the
    call format ``fmt``) rendered as :mod:`.tools.render` says; ``template_kwargs``: vLLM's
    ``chat_template_kwargs``, extra variables of the chat template (unused by the fallback)."""
    tok = model.tokenizer
    if tok is None:
        raise bad_request(
            f"model {model.name} has no tokenizer: use /v1/completions with token ids", param="messages"
        )
    if getattr(tok, "chat_template", None):
        taken = sorted(set(template_kwargs or {}) & _CONVERSATION_KEYS)
        if taken:
            raise bad_request(
                f"chat_template_kwargs may not set {taken[0]!r}: the server passes the conversation itself",
                param="chat_template_kwargs",
            )
        extra = {k: v for k, v in (template_kwargs or {}).items() if k not in _TEMPLATE_OWN}
        ids = apply_template(tok, [template_message(m) for m in messages], tools, fmt, extra)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return without_mask(tok, ids, model.info.mask_token_id)  # the template's own tokens stay special
    text = fallback_chat_text(messages, role_names=spells_role_names(model), tools=tools, fmt=fmt)
    return encode_text(model, text)

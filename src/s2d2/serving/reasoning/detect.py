"""Which reasoning parser a chat template calls for.

A Qwen3-style template lets the model open its reply with a ``<think>…</think>`` block (and writes an empty
one itself when ``enable_thinking`` is false): such a template gets the ``qwen3`` parser (vLLM's name for it).
LLaDA2's template also mentions ``<think>`` (to re-render reasoning of earlier turns) but always writes
``detailed thinking off`` into the system turn: its model does not think, so it gets no parser.
"""

from __future__ import annotations

#: The parser names :func:`detect_reasoning_parser` can return.
QWEN3 = "qwen3"

#: Text a template writes when it switches the model's thinking off for good (LLaDA2's system turn).
_THINKING_SWITCHED_OFF = "detailed thinking"


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """Return ``"qwen3"`` when ``chat_template`` writes ``<think>`` and does not switch thinking off with
    ``detailed thinking …`` (LLaDA2); ``None`` otherwise, including for no template at all."""
    if not chat_template or "<think>" not in chat_template:
        return None
    if _THINKING_SWITCHED_OFF in chat_template:
        return None
    return QWEN3

"""A shared prompt prefix for benchmarks: few-shot examples built from the task's own problems.

``s2d2 bench-batch --shared-prefix N`` and ``s2d2 bench-serve --shared-prefix N`` put the same N-token
prefix in front of every request, as a system prompt or few-shot examples do (GSM8K 8-shot, MBPP
3-shot): worked examples ("question answer") from the dev split, which the test problems never repeat,
cut to exactly N tokens of the model's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import S2D2Error
from .suites import load_problems


def shared_prefix_ids(
    encode: Callable[[str], list[int]], n_tokens: int, suite: str = "tiny-gsm"
) -> list[int]:
    """The first ``n_tokens`` token ids of worked dev examples of ``suite`` (``encode``: the model's)."""
    if n_tokens < 0:
        raise S2D2Error(f"--shared-prefix must be >= 0, got {n_tokens}")
    ids: list[int] = []
    if n_tokens == 0:
        return ids
    for p in load_problems(suite, "dev"):
        ids += encode(f"{p['question']} {p['answer']}\n")
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise S2D2Error(f"the dev split of {suite} holds fewer than {n_tokens} tokens of examples")


def shared_prefix_text(
    encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], n_tokens: int
) -> str:
    """The same prefix as text (for a server's clients), ending at a whitespace boundary."""
    if n_tokens == 0:
        return ""
    text = decode(shared_prefix_ids(encode, n_tokens))
    return text if text.endswith((" ", "\n")) else text + "\n"

"""What the server needs of the model it serves: :class:`ServedModel`, the part of
:class:`s2d2.S2D2Model` (what ``s2d2.load`` returns) that :mod:`s2d2.serving` reads and calls.

A structural type: any object with these members is served alike (tests may pass a stand-in). The
server only reads these attributes, never sets them; their values are fixed once the model is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..config import DecodeConfig
from ..constraints import CompiledConstraint, OutputConstraint
from ..cost.step_cost import StepCost
from ..families import ModelAdapter, ModelInfo
from ..scoring.scorer import TokenScores


@runtime_checkable
class ServedModel(Protocol):
    """A loaded block-diffusion model as the server uses it (:class:`s2d2.S2D2Model` is one)."""

    @property
    def name(self) -> str:
        """The model's name (the served model id unless ``served_name`` replaces it; named in errors)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """Its Hugging Face tokenizer, or None (then only token-id prompts are served). Read for its
        ``chat_template`` (optional: absent or empty means the server's fallback template),
        ``unk_token_id`` (optional), ``apply_chat_template`` and, for tool calls, ``encode`` /
        ``decode``; typed ``Any`` as the many tokenizer classes share no declared type."""
        ...

    @property
    def info(self) -> ModelInfo:
        """The family-independent facts: mask and EOS token ids, vocabulary size, context length
        (``max_length``) and the checkpoint's sampling defaults (``generation_defaults``)."""
        ...

    @property
    def adapter(self) -> ModelAdapter:
        """The family adapter the server's own streaming engine runs its forwards on."""
        ...

    @property
    def max_num_seqs(self) -> int:
        """Rows the model's engine decodes together (the server's default, >= 1)."""
        ...

    @property
    def max_query_tokens_per_row(self) -> int | None:
        """The bound on query tokens per row and forward (None: the engine's default)."""
        ...

    @property
    def kv_budget_tokens(self) -> int | None:
        """Positions of key/value memory the engine may hold (None: unbounded)."""
        ...

    @property
    def cost(self) -> StepCost | None:
        """The engine's step-cost profile, if any."""
        ...

    @property
    def prefix_cache(self) -> bool:
        """Whether the engine reuses cached prompt prefixes across requests."""
        ...

    @property
    def kv_page_size(self) -> int:
        """Positions per page of the engine's key/value memory."""
        ...

    def make_config(self, config: DecodeConfig | None = None, **settings: Any) -> DecodeConfig:
        """The model's defaults (or ``config``) with a ``preset`` and explicit ``settings`` on top;
        settings that are invalid or cannot apply raise a one-line :class:`s2d2.errors.S2D2Error`."""
        ...

    def compile_constraint(self, constraint: OutputConstraint | None) -> CompiledConstraint | None:
        """``constraint`` compiled for the tokenizer (None for None); an invalid one raises
        :class:`s2d2.errors.S2D2Error`. May be cached: called again per request with equal input."""
        ...

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        """Token ids of ``prompt`` (the server passes plain text, never ``chat``); may warn of words the
        tokenizer does not know (the server silences such warnings); no tokenizer raises."""
        ...

    def decode_ids(self, ids: Sequence[int], skip_special_tokens: bool = True, drop_stop: bool = True) -> str:
        """The text of ``ids``; with ``drop_stop`` a last EOS is left out. Works without a tokenizer (the
        ids as text). Called on the event loop each time a streamed output grows: it must be quick."""
        ...

    def score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, top_logprobs: int = 0
    ) -> list[TokenScores]:
        """Exact AR-mode log-probabilities of each ``(context, continuation)`` of token ids, one
        :class:`~s2d2.scoring.scorer.TokenScores` per request, in order (``top_logprobs`` k > 0: the k most
        likely tokens at each position too). Runs in a worker thread."""
        ...

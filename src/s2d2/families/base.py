"""The model adapter layer: how one family of block-diffusion models is called.

Decoders never touch a family's details. The engine lays out one :class:`Segment` per running row and
step with :mod:`s2d2.layouts` (the one door: a segment is a layout bound to a row's cache state, read
from the family's traits in :class:`ModelInfo`), then runs all of them as ONE batched forward
(:meth:`ModelAdapter.run`). ``new_pool()`` is the key/value memory of an engine: ``pool.new_state()``
admits a row, ``pool.release(state)`` retires it.

``prefill``, ``draft``, ``verify`` and ``commit`` run one such segment alone (a batch of one row). All
logits come back aligned to block slots: row ``j`` is the model's prediction for the token at slot ``j``,
whatever the family's convention (same-position or shifted). Checkpoints are read by :mod:`.checkpoint`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..forward.describe import Geometry
from ..forward.forward_batch import ForwardBatch
from ..forward.kv_pool import KVState, take_pages
from ..forward.segment import Segment
from ..layouts import family


@dataclass
class ModelInfo:
    """What decoders need to know about a model, family-independent."""

    family: str
    mask_token_id: int
    eos_token_ids: list[int]
    vocab_size: int
    #: Largest number of positions the model accepts.
    max_length: int
    #: Block size the checkpoint is run with (:mod:`.checkpoint_facts`: option, config, name or family).
    default_block_size: int | None = None
    #: Where the block size came from: ``option``, ``config.json:KEY``, ``name`` or ``family default``.
    block_size_source: str | None = None
    #: Sampling defaults of a request that omits them (``generation_config.json``'s; empty: s2d2's own).
    generation_defaults: dict[str, float] = field(default_factory=dict)
    #: True when logits at position i-1 predict token i (Fast-dLLM v2).
    shifted: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    #: True when a block-causal prefill adds its mask to the scores as 1.0/0.0 and masks nothing (the
    #: LLaDA2 official prefill; commits and a causal cache use the plain mask)
    prefill_bias: bool = False


class ModelAdapter(ABC):
    """Calls one family of block-diffusion models. See the module docstring for the protocol."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype

    # ------------------------------------------------------------------ what a family implements
    @abstractmethod
    def new_pool(
        self, *, page_size: int = 16, max_pages: int | None = None, reserve_tokens: int | None = None
    ) -> Any:
        """Key/value memory for many rows: ``.new_state() -> KVState`` and ``.release(state)``; a paged
        pool (:class:`~s2d2.forward.kv_pool.KVPool`) has ``page_size`` positions a page and at most
        ``max_pages`` pages (None: it grows; ``reserve_tokens`` is a hint of the positions its rows may
        hold together, :func:`~s2d2.forward.kv_pool.host_reservation`)."""

    @abstractmethod
    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Run ``segments`` (one per row, rows distinct) as one forward and return each segment's logits
        (after its ``finish``). The forward reads the rows' states and writes only their new keys and
        values (at ``[length, length + n)``, into pages the rows already hold): it advances no length and
        takes no page. The engine's step advances each row once, after the forward; callers outside the
        engine use :meth:`run_and_keep`."""

    def geometry(self, pool: Any) -> Geometry | None:
        """What describing a forward over rows of ``pool`` needs (:func:`~.describe.describe`), or None
        when this adapter runs segments only its own way (:meth:`run`: transformers' own forward)."""
        return None

    def forward(self, pool: Any, batch: ForwardBatch, summary: int | None = None) -> torch.Tensor:
        """The forward of ``batch``, described with :meth:`geometry` over rows of ``pool``: packed raw
        logits ``[L, vocab]`` (``batch.logit_sizes`` a row, before any segment's ``finish``) in the model's
        dtype; with ``summary`` (where :attr:`summarizes`; the token to leave out) the rows' summaries
        ``[L, WIDTH]`` float32 instead. Writes the batch's new keys and values into their slots; touches
        no request."""
        raise NotImplementedError(f"the {self.info.family} adapter has no batched forward")

    #: whether :meth:`forward` can give the rows' summaries instead of their logits (tensor-parallel ranks:
    #: :mod:`~s2d2.forward.vocab_summary`), then :meth:`full_logits` the logits of the same forward
    summarizes: bool = False

    def full_logits(self) -> torch.Tensor:
        """The full logits ``[L, vocab]`` of the last forward that gave summaries (see :attr:`summarizes`)."""
        raise NotImplementedError(f"the {self.info.family} adapter gives no summaries")

    def prepare(self, pool: Any) -> int:
        """Make the forward ready for an engine's ``pool`` before its first step (the lean forward on
        CUDA captures the common batch shapes' graphs, with one progress line); returns how many shapes
        were prepared (0: nothing to prepare)."""
        return 0

    def run_and_keep(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """:meth:`run` for callers outside the engine (scoring, one row alone, diagnostics): pages for
        each segment are taken first (:func:`~.kv_pool.take_pages`), and after the forward each row keeps
        its segment's ``keep`` new positions and the prediction the forward saved for it, if any
        (:meth:`~.segment.Segment.keep_prediction`)."""
        take_pages(segments)
        out = self.run(segments)
        for s in segments:
            s.state.advance(s.keep)
            s.keep_prediction()
        return out

    #: whether a block's committed prefix may be cached before the block is complete (causal cache)
    caches_partial_blocks: bool = True

    def supports_lead(self, causal: bool) -> bool:
        """Whether a draft (:func:`~s2d2.layouts.family.draft`) can carry the AR-mode query of the block's
        first masked slot (``lead``): same-position families with a causal cache."""
        return False

    def can_fold_prefill(self, causal: bool) -> bool:
        """Whether a prompt's whole blocks may be written by the first draft forward (as its ``pending``
        tokens) instead of a prefill forward of their own: true wherever the two compute the same keys."""
        return True

    # ------------------------------------------------------------------ one row alone
    # Each runs one segment of :mod:`s2d2.layouts.family` (the one place segments are laid out) on a row.
    def new_state(self) -> KVState:
        """A fresh row in a pool of its own."""
        return self.new_pool().new_state()

    def prefill(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        """Write ``ids`` (positions ``state.length`` onwards) into the cache; no logits."""
        if ids.numel():
            lay = family.prefill(self.info, state.length, ids, block_size=block_size, causal=causal)
            self.run_and_keep([Segment.of(state, lay)])

    def commit(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        """Write ``ids`` (positions ``state.length`` onwards) into the cache with one forward."""
        if ids.numel():
            lay = family.commit(self.info, state.length, ids, block_size=block_size, causal=causal)
            self.run_and_keep([Segment.of(state, lay)])

    def draft(
        self,
        state: KVState,
        pending: torch.Tensor,
        block: torch.Tensor,
        *,
        start: int,
        block_size: int,
        causal: bool,
    ) -> torch.Tensor:
        """Diffusion logits ``[len(block), vocab]`` of the block at ``start...``
        (:func:`~s2d2.layouts.family.draft`)."""
        lay = family.draft(self.info, state.length, pending, block, start=start, block_size=block_size,
                           causal=causal)  # fmt: skip
        return self.run_and_keep([Segment.of(state, lay)])[0]

    def verify(self, state: KVState, filled: torch.Tensor, *, start: int, slots: list[int]) -> torch.Tensor:
        """AR-mode logits ``[len(slots), vocab]`` (:func:`~s2d2.layouts.family.verify`)."""
        lay = family.verify(self.info, state.length, filled, start=start, slots=slots)
        return self.run_and_keep([Segment.of(state, lay)])[0]

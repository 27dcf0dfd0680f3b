"""Plumbing shared by adapters that drive a native transformers causal LM with 4-D masks.

A subclass only says how to build the native model from the checkpoint and, for shifted families, how
logits line up with block slots (a segment's ``finish``). :meth:`HFAdapter.run` runs a list of segments
as one batched forward on the lean path (:mod:`s2d2.adapters.fastpath`); transformers' own forward (kept
as the reference the golden tests compare against) runs them one row at a time against a
``DynamicCache`` and crops the cache back so that only the tokens we mean to commit stay in it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .base import ModelAdapter, ModelInfo
from .fastpath import FastDecoder
from .kv_pool import KVPool, KVState
from .masks import context_mask, draft_mask, score_mask, verify2l_mask
from .segment import Predraft, Segment


@functools.lru_cache(maxsize=4096)
def _draft_mask(
    m: int, committed: tuple[bool, ...], block_size: int, causal: bool, phase: int
) -> torch.Tensor:
    """:func:`draft_mask` among the new tokens, memoised (read-only: segments never mutate masks).

    Masks depend on the block's start only through ``start % block_size`` (``phase``): block- and
    token-causal relations are invariant under shifts by whole blocks.
    """
    start = phase + block_size * (m // block_size + 1)
    done = torch.tensor(committed, dtype=torch.bool)
    return draft_mask(0, m, done, block_size=block_size, causal=causal, start=start)


@functools.lru_cache(maxsize=4096)
def _lead_mask(m: int, committed: tuple[bool, ...], block_size: int, lead: int) -> torch.Tensor:
    """A causal draft mask (queries ``[pending | fed block]``) plus one last row and key: the AR-mode
    query of fed slot ``lead`` sees the pending tokens, the fed slots before it and itself (memoised)."""
    inner = _draft_mask(m, committed, block_size, True, 0)
    n = inner.shape[0]
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:n, :n] = inner
    mask[n, : m + lead] = True
    mask[n, n] = True
    return mask


@functools.lru_cache(maxsize=256)
def _causal_mask(n: int) -> torch.Tensor:
    """Token-causal ``[n, n]`` (memoised, read-only)."""
    return torch.ones(n, n, dtype=torch.bool).tril_()


@functools.lru_cache(maxsize=4096)
def _verify_mask(n_first: int, slots: tuple[int, ...]) -> torch.Tensor:
    """:func:`verify2l_mask` among the new tokens, memoised (read-only)."""
    return verify2l_mask(0, n_first, list(slots))


@functools.lru_cache(maxsize=4096)
def _fused_mask(
    n_first: int, slots: tuple[int, ...], groups: tuple[tuple[int, int, bool], ...]
) -> torch.Tensor:
    """The 2L verification mask of ``slots`` followed by pre-draft groups (``Predraft.key`` each: rows,
    visible first-half keys, head alone), memoised (read-only)."""
    two_l = _verify_mask(n_first, slots)
    if not groups:
        return two_l
    head = n_first + len(slots)
    n = head + sum(rows for rows, _, _ in groups)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:head, :head] = two_l
    at = head
    for rows, visible, head_alone in groups:
        mask[at : at + rows, :visible] = True
        mask[at : at + rows, at : at + rows] = True
        if head_alone:
            mask[at, at + 1 : at + rows] = False
        at += rows
    return mask


class DynamicCachePool:
    """Rows for transformers' own forward: one ``DynamicCache`` each (no shared memory)."""

    def __init__(self, config: Any):
        self.config = config

    def new_state(self) -> KVState:
        from transformers import DynamicCache

        return KVState(cache=DynamicCache(config=self.config), length=0)

    def release(self, state: KVState) -> None:
        state.cache, state.length = None, 0
        state.extra.clear()


class HFAdapter(ModelAdapter):
    """Same-position block-diffusion model on a native transformers ``*ForCausalLM``."""

    def __init__(self, model: torch.nn.Module, info: ModelInfo, path: Path | None = None):
        self.model = model.eval()
        self.info = info
        self.path = path
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        #: lean batched forward (None: transformers' own forward with a DynamicCache per row)
        self.fast = FastDecoder(model) if FastDecoder.supports(model) else None

    @property
    def caches_partial_blocks(self) -> bool:  # type: ignore[override]
        """A pool row keeps whatever a forward wrote past its length, so the engine can decide after the
        forward how much to keep; transformers' cache is cropped in the forward, so it cannot."""
        return self.fast is not None

    # ------------------------------------------------------------------ plumbing
    def new_pool(
        self, *, page_size: int = 16, max_pages: int | None = None, reserve_tokens: int | None = None
    ) -> Any:
        """A paged pool for the lean forward; transformers' own forward keeps one ``DynamicCache`` a row
        (unpaged, unbounded: its engine reserves positions instead)."""
        if self.fast is not None:
            return self.fast.new_pool(page_size=page_size, max_pages=max_pages, reserve_tokens=reserve_tokens)
        return DynamicCachePool(self.model.config)

    def prepare(self, pool: Any) -> int:
        return self.fast.capture(pool) if self.fast is not None and isinstance(pool, KVPool) else 0

    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        live = [s for s in segments if s.n]
        raw: dict[int, torch.Tensor] = {}
        if live and isinstance(live[0].state.cache, KVPool):
            for s, lg in zip(live, self.fast.forward(live[0].state.cache, live), strict=True):
                raw[id(s)] = lg
        else:
            for s in live:
                raw[id(s)] = self._native_forward(s)
        out = []
        for s in segments:
            rows = raw.get(id(s))
            if rows is None:  # an empty segment: no logits (made only here, not for every row)
                rows = torch.zeros(0, self.info.vocab_size, dtype=torch.float32, device=self.device)
            out.append(s.finish(rows) if s.finish is not None else rows)
        return out

    @torch.inference_mode()
    def _native_forward(self, seg: Segment) -> torch.Tensor:
        """One segment through transformers' own forward; the cache keeps only ``keep`` new tokens."""
        state, n = seg.state, seg.n
        stale = state.cache.get_seq_length() - state.length
        if stale > 0:  # what a failed batched forward left behind (the length did not advance): drop it
            state.cache.crop(-stale)
        allowed = torch.ones(n, state.length + n, dtype=torch.bool)
        allowed[:, state.length :] = seg.mask
        if seg.bias is None and seg.context_bias == 0.0:
            attention_mask = allowed[None, None].to(self.device)
        else:  # an additive float mask (the LLaDA2 official prefill)
            bias = torch.full((n, state.length + n), float(seg.context_bias))
            if seg.bias is not None:
                bias[:, state.length :] = seg.bias.float()
            bias = bias.masked_fill(~allowed, float("-inf"))
            attention_mask = bias.to(self.dtype)[None, None].to(self.device)
        k = seg.logit_rows.numel()
        out = self.model(
            input_ids=torch.as_tensor(seg.ids, dtype=torch.long).view(1, -1).to(self.device),
            position_ids=torch.as_tensor(seg.pos, dtype=torch.long).view(1, -1).to(self.device),
            attention_mask=attention_mask,
            cache=state.cache,
            use_cache=True,
            logits_to_keep=max(n - int(seg.logit_rows.min()), 1) if k else 1,
        )
        if seg.keep < n:
            state.cache.crop(-(n - seg.keep))
        if not k:
            return out.logits[0, :0]
        kept = out.logits[0]
        first = n - kept.shape[0]
        return kept[seg.logit_rows.to(kept.device) - first]

    def _forward(
        self,
        state: KVState,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        *,
        n_logits: int,
        keep: int,
    ) -> torch.Tensor:
        """One row alone with a full boolean mask ``[n, state.length + n]`` whose cache columns are all
        True; returns the last ``n_logits`` raw rows (for tests and diagnostics)."""
        n = ids.numel()
        assert bool(mask[:, : state.length].all()), "queries always see the whole cache"
        seg = Segment(
            state, ids, pos, mask[:, state.length :], keep=keep, logit_rows=Segment.last_rows(n, n_logits)
        )
        return self.run_and_keep([seg])[0]

    # ------------------------------------------------------------------ protocol
    def prefill_segment(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> Segment:
        n = ids.numel()
        pos = torch.arange(state.length, state.length + n)
        return Segment(
            state,
            ids,
            pos,
            context_mask(pos, pos, block_size, causal),
            keep=n,
            logit_rows=Segment.last_rows(n, 0),
        )

    def draft_segment(
        self,
        state: KVState,
        pending: torch.Tensor | Sequence[int],
        block: torch.Tensor | Sequence[int],
        *,
        start: int,
        block_size: int,
        causal: bool,
        cached: int = 0,
        extend: bool = False,
        lead: int | None = None,
    ) -> Segment:
        """A draft of ``block``; its first ``cached`` slots are in the cache already (a causal cache's
        committed prefix) and are not fed. With ``extend`` (causal cache only) the fed block's leading
        committed tokens are kept in the cache too (``keep`` grows by their number). Logits come back for
        every slot (cached slots' rows are zeros, never read), then, with ``lead``, one row of the AR-mode
        query of slot ``lead`` (see :meth:`ModelAdapter.draft_segment`). Token ids may come as host
        tensors or lists (the engine's host bookkeeping keeps lists: one tensor is made here)."""
        # host lists as they come (never modified here), else made once
        pend = pending if type(pending) is list else (
            pending.tolist() if isinstance(pending, torch.Tensor) else list(pending))  # fmt: skip
        fed = block[cached:] if type(block) is list else (
            block.tolist()[cached:] if isinstance(block, torch.Tensor) else list(block[cached:]))  # fmt: skip
        m, n = len(pend), len(fed) + cached
        assert state.length + m == start + cached, (
            "pending tokens must end where the block's uncached part starts"
        )
        mask_id = self.info.mask_token_id
        first_mask = fed.index(mask_id) if mask_id in fed else len(fed)
        committed = tuple([t != mask_id for t in fed]) if causal else (False,) * (n - cached)
        if lead is not None:
            assert causal and lead == cached + first_mask < n, (
                "the lead slot is the block's first masked slot, after its cached part, on a causal cache"
            )
            mask = _lead_mask(m, committed, block_size, first_mask)
            fed = fed + [self.info.mask_token_id]
        else:
            mask = _draft_mask(m, committed, block_size, causal, start % block_size)
        ids = pend + fed  # lists: the lean forward makes one tensor of every row's (segment.packed)
        if cached:
            pos = [*range(start - m, start), *range(start + cached, start + n)]
        else:
            pos = list(range(start - m, start + n))
        if lead is not None:
            pos.append(start + lead)
        ext = first_mask if extend and causal else 0
        rows = len(fed)
        seg = Segment(state, ids, pos, mask, keep=m + ext, logit_rows=Segment.last_rows(m + rows, rows))
        if cached:

            def finish(out: torch.Tensor) -> torch.Tensor:
                return F.pad(out, (0, 0, cached, 0))  # zero rows for the cached slots: one op

            seg.finish = finish
        return seg

    def supports_lead(self, causal: bool) -> bool:
        return causal and not self.info.shifted

    def lead_segment(
        self,
        state: KVState,
        pending: Sequence[int],
        block: Sequence[int],
        *,
        start: int,
        cached: int = 0,
        extend: bool = False,
    ) -> Segment:
        """See :meth:`ModelAdapter.lead_segment`: the lead's query sees exactly what it sees in a draft
        forward (:func:`_lead_mask`), and the rows before it are the draft's pending and committed rows,
        token-causal, so the kept keys are the draft forward's."""
        assert not self.info.shifted, "a shifted model's slot 0 draft is already the AR prediction"
        m = len(pending)
        assert state.length + m == start + cached, "pending tokens end where the block's uncached part starts"
        mask_id = self.info.mask_token_id
        first_mask = next(i for i in range(cached, len(block)) if block[i] == mask_id)
        ids = list(pending) + list(block[cached:first_mask]) + [mask_id]
        n = len(ids)
        pos = list(range(state.length, state.length + n))
        keep = m + (first_mask - cached if extend else 0)
        return Segment(state, ids, pos, _causal_mask(n), keep=keep,
                       logit_rows=Segment.last_rows(n, 1))  # fmt: skip

    def verify_segment(
        self, state: KVState, filled: Sequence[int] | torch.Tensor, *, start: int, slots: list[int],
        cached: int = 0,
    ) -> Segment:  # fmt: skip
        """The 2L verification of ``slots``: first half ``filled[cached : max(slots)]`` (the query for slot
        s only needs first-half keys < s; slots before ``cached`` are in the cache)."""
        return self._two_halves(state, filled, start, slots, cached, max(slots), ())

    def fused_verify_segment(
        self,
        state: KVState,
        filled: Sequence[int] | torch.Tensor,
        *,
        start: int,
        slots: list[int],
        predrafts: Sequence[Predraft],
        cached: int = 0,
    ) -> Segment:
        """A 2L verification whose first half covers ``filled[cached : max(slots) + 1]`` (so its keys/values
        can be kept as the block's cache entries), followed by the ``predrafts`` groups (their ``visible``
        counts first-half tokens, from ``cached``).

        Logit rows: the ``len(slots)`` verification rows, then every row of each group in order.
        """
        return self._two_halves(state, filled, start, slots, cached, max(slots) + 1, predrafts)

    def _two_halves(
        self,
        state: KVState,
        filled: Sequence[int] | torch.Tensor,
        start: int,
        slots: list[int],
        cached: int,
        n_first: int,
        predrafts: Sequence[Predraft],
    ) -> Segment:
        assert state.length == start + cached, "commit pending tokens (draft) before verifying"
        n1, n2 = n_first - cached, len(slots)
        block = filled.tolist() if isinstance(filled, torch.Tensor) else filled
        ids = [*block[cached:n_first], *[self.info.mask_token_id] * n2]
        pos = [*range(start + cached, start + n_first), *[start + s for s in slots]]
        for g in predrafts:
            ids += g.ids
            pos += g.pos
        n = len(ids)
        mask = _fused_mask(n1, tuple(s - cached for s in slots), tuple(g.key for g in predrafts))
        return Segment(state, ids, pos, mask, keep=0, logit_rows=Segment.last_rows(n, n - n1))

    def score_segment(
        self, state: KVState, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int
    ) -> Segment:
        """Same-position scoring: each scored token is read at a MASK query at its own position behind
        the tokens before it (:func:`~s2d2.adapters.masks.score_mask`); logit rows are the MASK rows."""
        start, p, mask_id = state.length, prefix.numel(), self.info.mask_token_id
        ids = [prefix, torch.full((p - score_from,), mask_id, dtype=torch.long)]
        pos = [torch.arange(start, start + p), torch.arange(start + score_from, start + p)]
        rows = [torch.arange(p, 2 * p - score_from)]
        at = 2 * p - score_from
        for b in branches:
            k = b.numel()
            ids += [b[:-1], torch.full((k,), mask_id, dtype=torch.long)]
            pos += [torch.arange(start + p, start + p + k - 1), torch.arange(start + p, start + p + k)]
            rows.append(torch.arange(at + k - 1, at + 2 * k - 1))
            at += 2 * k - 1
        mask = score_mask(p, score_from, [b.numel() for b in branches])
        return Segment(state, torch.cat(ids), torch.cat(pos), mask, keep=p, logit_rows=torch.cat(rows))

    # ------------------------------------------------------------------ helpers for subclasses
    @staticmethod
    def build_native(
        cls: Any,
        config: Any,
        weights: dict[str, torch.Tensor],
        path: Path,
        device: torch.device,
        dtype: torch.dtype,
    ) -> torch.nn.Module:
        """Instantiate ``cls(config)`` without random init, then load ``weights`` strictly."""
        from transformers.initialization import no_init_weights

        from .checkpoint import load_weights_into

        config._attn_implementation = "sdpa"
        with no_init_weights():
            model = cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
        weights = {k: v.to(dtype) for k, v in weights.items()}
        if getattr(config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)
        load_weights_into(model, weights, path)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        return model.to(device).eval()

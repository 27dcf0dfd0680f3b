"""Plumbing shared by adapters that drive a native transformers causal LM with 4-D masks.

A subclass only says how to build the native model from the checkpoint and, for shifted families, how
logits line up with block slots (a segment's ``finish``). The segments' layouts (ids, positions,
visibility as integers, logit rows) come from :mod:`s2d2.layouts`, family-independent, driven by the
family's traits (:class:`~.base.ModelInfo`). :meth:`HFAdapter.run` runs a list of segments
as one batched forward on the lean path (:mod:`s2d2.forward.fastpath`); transformers' own forward (kept
as the reference the golden tests compare against) runs them one row at a time against a
``DynamicCache`` and crops the cache back so that only the tokens we mean to commit stay in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..forward.describe import Geometry, per_row
from ..forward.fastpath import FastDecoder
from ..forward.forward_batch import ForwardBatch
from ..forward.kv_pool import KVPool, KVState
from ..forward.segment import Segment
from .base import ModelAdapter, ModelInfo


def rope_parameters(config: dict[str, Any], theta: float, **more: Any) -> dict[str, Any]:
    """A native config's ``rope_parameters``: the checkpoint's ``rope_scaling`` type (``default`` when it
    has none), ``theta``, ``more``, then the scaling's own fields."""
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    rope = {"rope_type": kind, "rope_theta": theta, **more}
    rope.update({k: v for k, v in scaling.items() if k not in ("type", "rope_type")})
    return rope


#: ``config.json`` fields every Qwen-style native config takes as they are
QWEN_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def qwen_config(cls: Any, config: dict[str, Any], more_keys: Sequence[str] = (), **extra: Any) -> Any:
    """A transformers Qwen-style config (``cls``: ``Qwen2Config``, ``Qwen3Config``) from ``config.json``:
    the fields of :data:`QWEN_KEYS` and ``more_keys`` it sets (not null), ``extra``, its rope (theta from
    ``rope_theta``, else ``rope_parameters``, else 10000) and full attention in every layer (no family here
    uses a sliding window)."""
    kwargs = {k: config[k] for k in (*QWEN_KEYS, *more_keys) if config.get(k) is not None}
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return cls(
        **kwargs,
        **extra,
        rope_parameters=rope_parameters(config, theta),
        use_sliding_window=False,
        sliding_window=None,
        layer_types=["full_attention"] * int(config["num_hidden_layers"]),
    )


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

    def __init__(self, model: torch.nn.Module, info: ModelInfo, path: Path | None = None, *, tp: Any = None):
        self.model = model.eval()
        self.info = info
        self.path = path
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        #: lean batched forward (None: transformers' own forward with a DynamicCache per row)
        self.fast = FastDecoder(model, tp=tp) if FastDecoder.supports(model) else None
        #: this rank's :class:`~s2d2.forward.tensor_parallel.TensorParallel` (None: the whole model here)
        self.tp = tp
        if tp is not None:
            if self.fast is None:
                raise ModelLoadError(
                    f"{path}: tensor parallelism needs the lean forward, which this model lacks"
                )
            tp.vocab_size = info.vocab_size

    @property
    def caches_partial_blocks(self) -> bool:  # type: ignore[override]
        """A pool row keeps whatever a forward wrote past its length, so the engine can decide after the
        forward how much to keep; transformers' cache is cropped in the forward, so it cannot; a shifted
        family's block is never cached in parts (slot 0 is predicted before the block)."""
        return self.fast is not None and not self.info.shifted

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

    def geometry(self, pool: Any) -> Geometry | None:
        return self.fast.geometry() if self.fast is not None and isinstance(pool, KVPool) else None

    def forward(self, pool: Any, batch: ForwardBatch, summary: int | None = None) -> torch.Tensor:
        if summary is None:
            return self.fast.forward_batch(pool, batch)
        return self.fast.forward_batch(pool, batch, summary)

    @property
    def summarizes(self) -> bool:  # type: ignore[override]
        """Tensor-parallel ranks of a family without shifted predictions (a shifted one saves whole rows)."""
        tp = None if self.fast is None else self.fast.tp
        return tp is not None and tp.size > 1 and not self.info.shifted

    def full_logits(self) -> torch.Tensor:
        return self.fast.full_logits()

    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        live = [s for s in segments if s.n]
        if live and isinstance(live[0].state.cache, KVPool):
            raw = self.fast.forward(live[0].state.cache, live)
        else:
            raw = [self._native_forward(s) for s in live]
        return per_row(segments, raw, self.info.vocab_size, self.device)

    @torch.inference_mode()
    def _native_forward(self, seg: Segment) -> torch.Tensor:
        """One segment through transformers' own forward; the cache keeps only ``keep`` new tokens."""
        state, n = seg.state, seg.n
        stale = state.cache.get_seq_length() - state.length
        if stale > 0:  # what a failed batched forward left behind (the length did not advance): drop it
            state.cache.crop(-stale)
        allowed = torch.ones(n, state.length + n, dtype=torch.bool)
        allowed[:, state.length :] = seg.dense
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
    def can_fold_prefill(self, causal: bool) -> bool:
        """A prefill bias (additive, nothing masked) differs from a draft's pending rows."""
        return causal or not self.info.prefill_bias

    def supports_lead(self, causal: bool) -> bool:
        return causal and not self.info.shifted

    # ------------------------------------------------------------------ helpers for subclasses
    @staticmethod
    def build_native(
        cls: Any,
        config: Any,
        weights: dict[str, torch.Tensor],
        path: Path,
        device: torch.device,
        dtype: torch.dtype,
        prepare: Any = None,
    ) -> torch.nn.Module:
        """Instantiate ``cls(config)`` without random init, then load ``weights`` strictly (``prepare(model)``
        first, where given: a tensor-parallel rank replaces modules by its shards' there)."""
        from transformers.initialization import no_init_weights

        from .checkpoint import load_weights_into

        config._attn_implementation = "sdpa"
        with no_init_weights():
            model = cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
            if prepare is not None:
                prepare(model)
        weights = {k: v.to(dtype) for k, v in weights.items()}
        if getattr(config, "tie_word_embeddings", False):  # a tied checkpoint stores the embedding only
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        load_weights_into(model, weights, path)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        return model.to(device).eval()

"""Plumbing shared by adapters that drive a native transformers causal LM with 4-D masks.

A subclass only says how to build the native model from the checkpoint (:meth:`build_model`) and, for
shifted families, how logits line up with block slots. The forward helper here runs one call against a
``DynamicCache`` and crops the cache back so that only the tokens we mean to commit stay in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .base import KVState, ModelAdapter, ModelInfo, context_mask, draft_mask, verify2l_mask
from .fastpath import FastQwen


class HFAdapter(ModelAdapter):
    """Same-position block-diffusion model on a native transformers ``*ForCausalLM``."""

    def __init__(self, model: torch.nn.Module, info: ModelInfo, path: Path | None = None):
        self.model = model.eval()
        self.info = info
        self.path = path
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        #: lean forward for Qwen2/Qwen3 backbones (None: transformers' own forward with a DynamicCache)
        self.fast = FastQwen(model) if FastQwen.supports(model) else None

    # ------------------------------------------------------------------ plumbing
    def new_state(self) -> KVState:
        if self.fast is not None:
            return KVState(cache=self.fast.new_cache(), length=0)
        from transformers import DynamicCache

        return KVState(cache=DynamicCache(config=self.model.config), length=0)

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """Boolean ``[q, k]`` mask -> what the model's attention takes (``[1, 1, q, k]`` bool)."""
        return mask[None, None].to(self.device)

    @torch.inference_mode()
    def _forward(
        self,
        state: KVState,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        *,
        n_logits: int,
        keep: int,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``ids`` at positions ``pos`` with ``mask``; return the last ``n_logits`` rows of logits
        (float32) and keep only the first ``keep`` new tokens' keys/values in the cache."""
        n_new = ids.numel()
        if self.fast is not None and attention_mask is None:
            logits = self.fast.forward(state.cache, ids, pos, mask, start=state.length, n_logits=n_logits)
            state.length += keep
            return logits
        out = self.model(
            input_ids=ids.view(1, -1).to(self.device),
            position_ids=pos.view(1, -1).to(self.device),
            attention_mask=self._mask_for_model(mask) if attention_mask is None else attention_mask,
            cache=state.cache,
            use_cache=True,
            logits_to_keep=max(n_logits, 1),
        )
        if keep < n_new:
            state.cache.crop(-(n_new - keep))
        state.length += keep
        logits = out.logits[0]
        return logits[-n_logits:].float() if n_logits else logits[:0].float()

    # ------------------------------------------------------------------ protocol
    def prefill(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        self.commit(state, ids, block_size=block_size, causal=causal)

    def commit(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> None:
        n = ids.numel()
        if n == 0:
            return
        pos = torch.arange(state.length, state.length + n)
        mask = torch.ones(n, state.length + n, dtype=torch.bool)
        mask[:, state.length :] = context_mask(pos, pos, block_size, causal)
        self._forward(state, ids, pos, mask, n_logits=0, keep=n)

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
        m, n = pending.numel(), block.numel()
        assert state.length + m == start, "pending tokens must end where the block starts"
        committed = block != self.info.mask_token_id
        mask = draft_mask(state.length, m, committed, block_size=block_size, causal=causal, start=start)
        ids = torch.cat([pending, block]) if m else block
        pos = torch.arange(start - m, start + n)
        return self._forward(state, ids, pos, mask, n_logits=n, keep=m)

    def verify(self, state: KVState, filled: torch.Tensor, *, start: int, slots: list[int]) -> torch.Tensor:
        assert state.length == start, "commit pending tokens (draft) before verifying"
        n_first = max(slots)  # second-half query for slot s only needs first-half keys < s
        first = filled[:n_first]
        second = torch.full((len(slots),), self.info.mask_token_id, dtype=filled.dtype)
        ids = torch.cat([first, second])
        pos = torch.cat([torch.arange(start, start + n_first), start + torch.tensor(slots, dtype=torch.long)])
        mask = verify2l_mask(state.length, n_first, slots)
        return self._forward(state, ids, pos, mask, n_logits=len(slots), keep=0)

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

        from .base import load_weights_into

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

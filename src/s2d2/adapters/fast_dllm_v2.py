"""Fast-dLLM v2 family: shifted (AR-style) predictions on a Qwen2 backbone.

The checkpoint's ``config.json`` says ``model_type: Fast_dLLM_Qwen`` and points at remote code; we never run
that code. Its weights use Qwen2's names (biases on the q/k/v projections), so the model is transformers'
native ``Qwen2ForCausalLM`` driven with 4-D masks (see :mod:`s2d2.adapters.hf`). The real ``config.json``
has no mask id: it comes from the tokenizer (``|<MASK>|``, read from ``added_tokens.json`` or
``tokenizer.json``). ``bd_size`` is the block size the checkpoint was trained with.

Logit convention (shifted): the hidden state at absolute position ``p`` scores the token at ``p + 1``. The
adapter re-aligns rows to block slots, so row ``j`` of :meth:`draft` / :meth:`verify` is the model's
prediction for slot ``j``:

* slot ``j >= 1`` is read from the row of slot ``j - 1`` of the same forward;
* slot 0 is predicted by the last position *before* the block. In :meth:`draft` with pending tokens that is
  the last pending row (one extra logits row of the same forward). Otherwise it is the row saved in
  ``state.extra`` by the forward that wrote position ``start - 1`` (prefill, commit or a draft's pending
  tokens). This is the true AR prediction; the reference code's ``_shift_logits_right`` instead puts raw
  row 0 (the prediction for slot 1) at slot 0 as a never-used placeholder, because it always fills slot 0 by
  an AR step after finishing the previous block. With an empty cache (block at position 0) there is no
  prediction for slot 0 and its row is all zeros (a uniform distribution).

:meth:`verify` is a plain token-causal forward over the draft-filled block (read only): row ``j - 1``
holds the AR predictive logits for slot ``j`` given ``filled[:j]``; slot 0 again uses the saved row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError
from ..layouts import layout
from .base import ModelInfo
from .checkpoint import find_mask_token, load_safetensors, matches_family, require_mask_token
from .hf import HFAdapter
from .kv_pool import KVState
from .sdar import eos_ids
from .segment import Segment

FAMILY = "fast_dllm_v2"
MODEL_TYPES = ("fast_dllm_qwen",)
ARCHITECTURES = ("Fast_dLLM_QwenForCausalLM",)
#: Class-name fragment of the remote code named in ``auto_map``.
AUTO_MAP_NAME = "fast_dllm_qwen"
#: Tokenizer names of the mask token, most likely first (the real model uses ``|<MASK>|``).
MASK_TOKENS = ("|<MASK>|", "<|MASK|>", "<|mask|>", "<mask>", "[MASK]")

_QWEN2_KEYS = (
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
    "attention_dropout",
)
#: ``state.extra`` key: ``(position, logits row [V] predicting the token at that position)``.
NEXT_LOGITS = "fast_dllm_v2.next_logits"


def detect(config: dict[str, Any]) -> bool:
    return matches_family(config, MODEL_TYPES, ARCHITECTURES, (AUTO_MAP_NAME,))


def mask_token_id(config: dict[str, Any], added: dict[str, int]) -> int | None:
    return find_mask_token(config, added, MASK_TOKENS)


def qwen2_config(config: dict[str, Any]) -> Any:
    from transformers import Qwen2Config

    kwargs = {k: config[k] for k in _QWEN2_KEYS if config.get(k) is not None}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling") or {}
    rope_params = {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": theta}
    rope_params.update({k: v for k, v in scaling.items() if k not in ("type", "rope_type")})
    qcfg = Qwen2Config(
        **kwargs,
        rope_parameters=rope_params,
        use_sliding_window=False,  # no family here uses a sliding window
        sliding_window=None,
        layer_types=["full_attention"] * int(config["num_hidden_layers"]),
    )
    qcfg.head_dim = int(head_dim)
    return qcfg


class FastDLLMv2Adapter(HFAdapter):
    """Fast-dLLM v2 on a native ``Qwen2ForCausalLM``: shifted logits re-aligned to block slots."""

    caches_partial_blocks = False

    # ------------------------------------------------------------------ slot-0 bookkeeping
    def _save_next(self, state: KVState, pos: int, row: torch.Tensor) -> None:
        """Remember ``row`` as the prediction for position ``pos`` (the first one after what the forward
        keeps: the row's next uncached position once the step has advanced it)."""
        state.extra[NEXT_LOGITS] = (pos, row)

    def _next_logits(self, state: KVState, pos: int) -> torch.Tensor:
        """The saved prediction for position ``pos`` (zeros, i.e. uniform, when ``pos == 0``)."""
        saved = state.extra.get(NEXT_LOGITS)
        if saved is not None and saved[0] == pos:
            return saved[1]
        if pos == 0:
            return torch.zeros(self.info.vocab_size, dtype=self.dtype, device=self.device)
        raise RuntimeError(
            f"no saved prediction for position {pos}: the cache must be written by this adapter's "
            "prefill/commit/draft (or pass the last committed tokens as `pending`)"
        )

    # ------------------------------------------------------------------ protocol
    def _commit_forward(
        self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool, n_logits: int
    ) -> torch.Tensor:
        """Write ``ids`` at ``state.length...`` and return the last ``n_logits`` raw (unshifted) rows."""
        seg = HFAdapter.prefill_segment(self, state, ids, block_size=block_size, causal=causal)
        seg.logit_rows = Segment.last_rows(seg.n, n_logits)
        return self.run_and_keep([seg])[0]

    def prefill_segment(self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool) -> Segment:
        """Also keeps the last row: the prediction for the first position after ``ids``."""
        seg = super().prefill_segment(state, ids, block_size=block_size, causal=causal)
        seg.logit_rows = Segment.last_rows(seg.n, 1)
        after = state.length + seg.n

        def finish(rows: torch.Tensor) -> torch.Tensor:
            self._save_next(state, after, rows[-1])
            return rows[:0]

        seg.finish = finish
        return seg

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
        """As the same-position draft; a shifted block is never partly cached (slot 0's prediction comes
        from the position before the block), so ``cached`` must be 0 and ``extend`` is ignored."""
        assert cached == 0, "a shifted model's block is not cached in parts"
        assert lead is None, "a shifted model's slot 0 draft is already the AR prediction"
        m, n = len(pending), len(block)
        seg = super().draft_segment(state, pending, block, start=start, block_size=block_size, causal=causal)
        if m:
            # rows: [last pending | block slots 0..n-1]; the last pending row predicts slot 0.
            seg.logit_rows = Segment.last_rows(m + n, n + 1)

            def finish(rows: torch.Tensor) -> torch.Tensor:
                self._save_next(state, start, rows[0])
                return rows[:n]

        else:

            def finish(rows: torch.Tensor) -> torch.Tensor:
                return torch.cat([self._next_logits(state, start)[None], rows[: n - 1]])

        seg.finish = finish
        return seg

    def verify_segment(
        self, state: KVState, filled: Sequence[int] | torch.Tensor, *, start: int, slots: list[int],
        cached: int = 0,
    ) -> Segment:  # fmt: skip
        """A plain token-causal forward over the draft-filled block (:func:`~s2d2.layouts.layout.
        shifted_verify`); slot ``s`` is read from the row of slot ``s - 1``, slot 0 from the saved row."""
        assert cached == 0, "a shifted model's block is not cached in parts"
        seg = Segment.of(state, layout.shifted_verify(state.length, filled, start=start, slots=slots))

        def finish(rows: torch.Tensor) -> torch.Tensor:
            return torch.stack([self._next_logits(state, start) if s == 0 else rows[s - 1] for s in slots])

        seg.finish = finish
        return seg

    def score_segment(
        self, state: KVState, prefix: torch.Tensor, branches: Sequence[torch.Tensor], *, score_from: int
    ) -> Segment:
        """Shifted scoring (:func:`~s2d2.layouts.layout.shifted_score`): a plain causal forward over
        ``prefix`` and each branch but its last token; a token is scored from the row before it (the first
        one from the saved row of the position before the segment). The last prefix row is saved for the
        next segment of the row."""
        start, p = state.length, prefix.numel()
        lay, need = layout.shifted_score(start, prefix, branches, score_from=score_from)
        where = {r: i for i, r in enumerate(lay.logit_rows.tolist())}

        def finish(rows: torch.Tensor) -> torch.Tensor:
            saved = self._next_logits(state, start) if -1 in need else None
            out = [saved if r < 0 else rows[where[r]] for r in need]
            if p:
                self._save_next(state, start + p, rows[where[p - 1]])
            return torch.stack(out) if out else rows[:0]

        seg = Segment.of(state, lay)
        seg.finish = finish
        return seg


def load(
    path: Path,
    config: dict[str, Any],
    added: dict[str, int],
    *,
    device: torch.device,
    dtype: torch.dtype,
    **options: Any,
) -> FastDLLMv2Adapter:
    from transformers import Qwen2ForCausalLM

    if options:
        raise ModelLoadError(f"unknown option(s) for the {FAMILY} family: {', '.join(sorted(options))}")
    try:
        qcfg = qwen2_config(config)
        bd_size = config.get("bd_size")
        bd_size = int(bd_size) if bd_size is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{path}/config.json is not a valid Fast-dLLM v2 config ({exc.__class__.__name__}: {exc})"
        ) from None
    mask_id = require_mask_token(path, config, added, MASK_TOKENS, qcfg.vocab_size)
    weights = load_safetensors(path)
    model = HFAdapter.build_native(Qwen2ForCausalLM, qcfg, weights, path, device, dtype)
    info = ModelInfo(
        family=FAMILY,
        mask_token_id=mask_id,
        eos_token_ids=eos_ids(config),
        vocab_size=qcfg.vocab_size,
        max_length=int(config.get("max_position_embeddings", 32768)),
        default_block_size=bd_size,
        shifted=True,
        pad_token_id=config.get("pad_token_id"),
        bos_token_id=config.get("bos_token_id"),
    )
    return FastDLLMv2Adapter(model, info, path)

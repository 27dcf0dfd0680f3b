"""Fast-dLLM v2 family: shifted (AR-style) predictions on a Qwen2 backbone.

The checkpoint's ``config.json`` says ``model_type: Fast_dLLM_Qwen`` and points at remote code; we never run
that code. Its weights use Qwen2's names (biases on the q/k/v projections), so the model is transformers'
native ``Qwen2ForCausalLM`` driven with 4-D masks (see :mod:`s2d2.families.hf`). The real ``config.json``
has no mask id: it comes from the tokenizer (``|<MASK>|``, read from ``added_tokens.json`` or
``tokenizer.json``). ``bd_size`` is the block size the checkpoint was trained with.

Logit convention (shifted): the hidden state at absolute position ``p`` scores the token at ``p + 1``. The
layouts re-align rows to block slots (the ``shifted`` trait: :mod:`s2d2.layouts.shifted`), so row ``j``
of :meth:`draft` / :meth:`verify` is the model's prediction for slot ``j``:

* slot ``j >= 1`` is read from the row of slot ``j - 1`` of the same forward;
* slot 0 is predicted by the last position *before* the block. In :meth:`draft` with pending tokens that is
  the last pending row (one extra logits row of the same forward). Otherwise it is the row saved in
  ``state.extra`` from the forward that wrote position ``start - 1`` (prefill, commit or a draft's pending
  tokens; the forward returns it in ``Segment.saves`` and the row's writer keeps it). This is the true AR
  prediction; the reference code's ``_shift_logits_right`` instead puts raw row 0 (the prediction for
  slot 1) at slot 0 as a never-used placeholder, because it always fills slot 0 by an AR step after
  finishing the previous block. With an empty cache (block at position 0) there is no prediction for
  slot 0 and its row is all zeros (a uniform distribution).

:meth:`verify` is a plain token-causal forward over the draft-filled block (read only): row ``j - 1``
holds the AR predictive logits for slot ``j`` given ``filled[:j]``; slot 0 again uses the saved row.
"""

from __future__ import annotations

from typing import Any

import torch

from ..forward.kv_pool import KVState
from ..forward.segment import Segment
from ..layouts import layout
from .checkpoint_facts import FamilyRules
from .hf import HFAdapter, qwen_config
from .loader import FamilySpec
from .sharding import dense_checkpoint
from .tensor_names import mlp, qwen_names

FAMILY = "fast_dllm_v2"
MODEL_TYPES = ("fast_dllm_qwen",)
ARCHITECTURES = ("Fast_dLLM_QwenForCausalLM",)
#: Class-name fragment of the remote code named in ``auto_map``.
AUTO_MAP_NAME = "fast_dllm_qwen"
#: Tokenizer names of the mask token, most likely first (the real model uses ``|<MASK>|``).
MASK_TOKENS = ("|<MASK>|", "<|MASK|>", "<|mask|>", "<mask>", "[MASK]")
#: A checkpoint's ``bd_size`` is its block size; without one, the 32 Fast-dLLM v2's own forward defaults to.
RULES = FamilyRules(mask_tokens=MASK_TOKENS, published_block_size=32)

#: ``config.json`` fields taken as they are beyond :data:`~.hf.QWEN_KEYS`
_QWEN2_KEYS = ("attention_dropout",)



def tensor_names(config: dict[str, Any]) -> list[str]:
    """The checkpoint tensors this family reads (Qwen2's names: q/k/v biases, no q/k norms)."""
    return qwen_names(config, qk_norm=False, qkv_bias=True, o_bias=False, mlp_of=lambda i, p: mlp(p))


def qwen2_config(config: dict[str, Any]) -> Any:
    """The ``Qwen2Config`` of a Fast-dLLM v2 checkpoint's ``config.json`` (``head_dim`` set after: hidden
    size / heads where it gives none)."""
    from transformers import Qwen2Config

    qcfg = qwen_config(Qwen2Config, config, _QWEN2_KEYS)
    qcfg.head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return qcfg


class FastDLLMv2Adapter(HFAdapter):
    """Fast-dLLM v2 on a native ``Qwen2ForCausalLM``. Its shifted logits are the ``shifted`` trait of its
    :class:`~.base.ModelInfo`: the layouts re-align them to block slots (:mod:`s2d2.layouts.shifted`)."""

    def _commit_forward(
        self, state: KVState, ids: torch.Tensor, *, block_size: int, causal: bool, n_logits: int
    ) -> torch.Tensor:
        """Write ``ids`` at ``state.length...`` and return the last ``n_logits`` raw (unshifted) rows."""
        lay = layout.prefill(state.length, ids, block_size=block_size, causal=causal)
        seg = Segment.of(state, lay._replace(logit_rows=Segment.last_rows(lay.keep, n_logits)))
        return self.run_and_keep([seg])[0]


SPEC = FamilySpec(
    name=FAMILY,
    title="Fast-dLLM v2",
    model_types=MODEL_TYPES,
    architectures=ARCHITECTURES,
    auto_map_names=(AUTO_MAP_NAME,),
    rules=RULES,
    native_class="Qwen2ForCausalLM",
    native_config=qwen2_config,
    weights=dense_checkpoint,  # this rank's slices only, under tensor parallel
    tensor_names=tensor_names,
    adapter=FastDLLMv2Adapter,
    shifted=True,
)

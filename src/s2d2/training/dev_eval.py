"""Dev evaluation of a tiny model (tiny-gsm by default) during training, on the batched engine: greedy AR
mode and the dynamic-threshold block decoder (B=8, tau=0.9), whose accuracies select the checkpoint.

The model being trained is decoded in place (its live weights, no copy) through the same adapter and
engine as a loaded checkpoint, so a dev figure here is what ``s2d2 eval`` gives on the saved model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from s2d2.families.base import ModelInfo
from s2d2.families.hf import HFAdapter
from s2d2.model import S2D2Model
from s2d2.tasks.tiny_gsm.scoring import is_correct

__all__ = ["DEV_DECODERS", "MAX_NEW_TOKENS", "evaluate", "live_model"]

MAX_NEW_TOKENS = 56
#: Rows decoded together during a dev evaluation.
DEV_MAX_NUM_SEQS = 64
#: What the dev evaluation measures: name -> decoding settings.
DEV_DECODERS: dict[str, dict[str, Any]] = {
    "acc_ar": dict(decoder="ar"),
    "acc_dyn8": dict(decoder="dynamic", block_size=8, threshold=0.9),
}


def live_model(model: torch.nn.Module, tok: Any, max_num_seqs: int = DEV_MAX_NUM_SEQS) -> S2D2Model:
    """The training model (a ``Qwen3ForCausalLM`` in eval mode) as an :class:`S2D2Model` on its own
    weights, with its task's tokenizer ``tok``."""
    cfg = model.config
    info = ModelInfo(
        family="sdar",
        mask_token_id=int(tok.mask_token_id),
        eos_token_ids=[int(tok.eos_token_id)],
        vocab_size=int(cfg.vocab_size),
        max_length=int(cfg.max_position_embeddings),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    return S2D2Model(HFAdapter(model, info), tok, name="training", max_num_seqs=max_num_seqs)


def _gsm_correct(text: str, problem: dict) -> bool:
    return is_correct(text, problem["final"])


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    tok: Any,
    problems: list[dict],
    correct: Callable[[str, dict], bool] = _gsm_correct,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> dict:
    """Dev accuracy (and engine forwards) of each of :data:`DEV_DECODERS`, plus their sum ``score``;
    ``correct(text, problem)`` scores a completion (default: tiny-gsm's final number)."""
    model.eval()
    m = live_model(model, tok)
    questions = [p["question"] for p in problems]
    res: dict[str, float] = {}
    for name, settings in DEV_DECODERS.items():
        before = m.engine.stats()["forwards"]
        outs = m.generate_batch(questions, max_new_tokens=max_new_tokens, **settings)
        hits = sum(correct(o.text, p) for o, p in zip(outs, problems, strict=True))
        res[name] = hits / max(1, len(problems))
        res[name.replace("acc", "forwards")] = m.engine.stats()["forwards"] - before
    res["score"] = res["acc_ar"] + res["acc_dyn8"]
    model.train()
    return res

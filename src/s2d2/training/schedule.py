"""What tiny-gsm trains when, and how: the block-size mix, the AR-only phase first, the optimiser and its
learning-rate schedule."""

from __future__ import annotations

import math

import torch

__all__ = [
    "AR_FIRST",
    "AR_ONLY_MIX",
    "BETAS",
    "BLOCK_MIX",
    "CLIP",
    "LR",
    "LR_FLOOR",
    "WARMUP_STEPS",
    "WEIGHT_DECAY",
    "check_ar_first",
    "check_lr",
    "lr_factor",
    "make_optimiser",
    "mix_at",
    "parse_block_mix",
]

#: Block sizes of the diffusion objective and their weights (one size drawn per batch).
BLOCK_MIX = {2: 0.1, 4: 0.3, 8: 0.35, 16: 0.25}
AR_ONLY_MIX: dict[int, float] = {1: 1.0}
#: Fraction of the budget trained in AR mode only before the block mix starts (new runs; see mix_at).
AR_FIRST = 0.5
#: Peak learning rate, linear warm-up steps, and the cosine decay's floor (a fraction of the peak).
LR, WARMUP_STEPS, LR_FLOOR = 2e-3, 200, 0.1
#: AdamW betas and weight decay (matrices only), and the gradient-norm clip.
BETAS, WEIGHT_DECAY, CLIP = (0.9, 0.98), 0.1, 1.0


def parse_block_mix(text: str) -> dict[int, float]:
    """Parse ``"B=weight,B=weight,..."`` (e.g. ``"1=1"`` or ``"2=.1,4=.3,8=.35,16=.25"``) into a mix.

    Block sizes are integers >= 1, weights positive numbers (normalised when drawing); a size may appear
    once. Raises ``ValueError`` with a one-line message otherwise.
    """
    mix: dict[int, float] = {}
    for part in text.split(","):
        size, sep, weight = part.strip().partition("=")
        try:
            b, w = int(size), float(weight)
        except ValueError:
            b, w = 0, 0.0
        if not sep or b < 1 or not (w > 0 and math.isfinite(w)):
            raise ValueError(
                f"bad block mix entry {part.strip()!r}: expected B=WEIGHT with B >= 1, WEIGHT > 0"
            )
        if b in mix:
            raise ValueError(f"block size {b} appears twice in the block mix")
        mix[b] = w
    return mix


def check_ar_first(ar_first: float) -> float:
    """``ar_first`` as a float in [0, 1); ``ValueError`` with a one-line message otherwise."""
    if not 0.0 <= ar_first < 1.0:
        raise ValueError(f"ar_first must be in [0, 1), got {ar_first}")
    return float(ar_first)


def check_lr(lr: float) -> float:
    """A peak learning rate in (0, 1); ``ValueError`` with a one-line message otherwise."""
    if not 0.0 < lr < 1.0:
        raise ValueError(f"learning rate must be in (0, 1), got {lr}")
    return float(lr)


def mix_at(progress: float, ar_first: float, block_mix: dict[int, float] | None) -> dict[int, float]:
    """The block mix to train at ``progress`` (fraction of the budget done): AR mode only
    (:data:`AR_ONLY_MIX`) while ``progress < ar_first``, then ``block_mix`` (default :data:`BLOCK_MIX`).

    Diffusion samples teach AR mode almost nothing on this task (measured: AR-only training reaches a
    given AR accuracy in less than half the time of the mixed objective), so an AR phase first buys
    the verifier's accuracy cheaply and the drafter is then trained on top of it.
    """
    return AR_ONLY_MIX if progress < check_ar_first(ar_first) else (block_mix or BLOCK_MIX)


def lr_factor(step: int, frac: float) -> float:
    """The learning rate at optimiser step ``step`` with ``frac`` of the budget done, as a fraction of the
    peak: linear warm-up over :data:`WARMUP_STEPS`, times a cosine decay from 1 to :data:`LR_FLOOR`."""
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    frac = min(max(frac, 0.0), 1.0)
    return warm * (LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimiser(model) -> torch.optim.AdamW:
    """AdamW at :data:`LR` with :data:`BETAS`, weight decay :data:`WEIGHT_DECAY` on the matrices only."""
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=BETAS,
    )

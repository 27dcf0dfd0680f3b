"""Applying grammar bitmasks to logits on the model's device (pure tensor ops: no host transfer)."""

from __future__ import annotations

import torch


def allowed(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool ``[n, vocab]`` from an int32 bitmask ``[n, words]`` (bit j of word w: token 32 w + j)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().view(bits.shape[0], -1)[:, :vocab]


def masked_rows(rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``rows`` ``[S, vocab]`` (a new tensor) with tokens the bitmask forbids at -inf in its first
    ``bits.shape[0]`` rows; later rows are copied as they are."""
    k = bits.shape[0]
    ok = allowed(bits, rows.shape[-1])
    head = rows[:k].masked_fill(~ok, float("-inf"))
    return head if k == rows.shape[0] else torch.cat([head, rows[k:]])

"""The rows' summaries reduced slice by slice (each tensor-parallel rank's vocabulary) equal what the step
computes from the whole rows: the greedy token exactly (ties to the first token, across slices too), and
its probability, margin, entropy, squared-probability sum and every acceptance estimator within float32
rounding."""

from __future__ import annotations

import math

import pytest
import torch

from s2d2.decoding import functional as F
from s2d2.decoding.logits_readers import Summaries
from s2d2.forward.vocab_summary import ENTROPY, MARGIN, PROB, SQUARES, TOKEN, combine, local_summary

MASK = 3


def _sliced(x: torch.Tensor, n: int) -> torch.Tensor:
    """The summaries of ``x`` ``[L, V]`` reduced over ``n`` slices of ``ceil(V / n)`` (the last padded)."""
    vocab = x.shape[-1]
    per = math.ceil(vocab / n)
    padded = torch.cat([x, torch.zeros(x.shape[0], per * n - vocab)], dim=1)
    parts = [local_summary(padded[:, r * per : (r + 1) * per], r * per, vocab, MASK) for r in range(n)]
    return combine(torch.stack(parts))


def _rows(vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, vocab, generator=g) * 3
    x[0, 2] = x[0, vocab - 1] = 30.0  # a tie across the first and last slices: the first token wins
    x[1, MASK] = 99.0  # the mask token never counts
    x[2, :] = 0.5  # a flat row: every token ties
    x[3, 7] = 25.0  # a peaked row
    return x


@pytest.mark.parametrize("vocab", [10, 257, 4099])
@pytest.mark.parametrize("slices", [1, 2, 3, 4])
def test_sliced_summaries_equal_the_whole_rows_values(vocab, slices):
    x = _rows(vocab, vocab + slices)
    masked = x.clone()
    masked[:, MASK] = float("-inf")
    probs = F.probs_from_logits(masked)
    token, prob = F.greedy_pick(probs)
    got = _sliced(x, slices)
    assert torch.equal(got[:, TOKEN].long(), token)
    assert got[0, TOKEN] == 2 and got[1, TOKEN] != MASK and got[2, TOKEN] == 0
    close = dict(atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got[:, PROB], prob, **close)
    torch.testing.assert_close(got[:, MARGIN], F.margin(probs), **close)
    torch.testing.assert_close(got[:, ENTROPY], F.entropy(probs), atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, SQUARES], probs.pow(2).sum(-1), **close)
    for name, param in [("hard-margin", 0.3), ("hard-entropy", 0.4), ("confidence-power", 2.0),
                        ("clipped-margin", 1.5), ("soft-entropy", 3.0), ("renyi2", None)]:  # fmt: skip
        want = F.acceptance_estimate(name, probs, token, param)
        estimate = Summaries(vocab).read(got, None).acceptance(name, None, param)
        torch.testing.assert_close(estimate, want, atol=5e-5, rtol=1e-4)


def test_an_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown estimator"):
        Summaries(10).read(_sliced(_rows(10, 0), 2), None).acceptance("nope", None, None)


def test_a_slice_is_left_as_it_was():
    """The step may still ask for the same forward's whole logits (raw, the mask token's included; the
    padding past the vocabulary is never gathered)."""
    x = _rows(64, 1)
    before = x.clone()
    local_summary(x[:, 32:], 32, 60, 40)  # a slice holding the excluded token and 4 padding columns
    local_summary(x[:, :32], 0, 60, MASK)
    assert torch.equal(x[:, :60], before[:, :60])

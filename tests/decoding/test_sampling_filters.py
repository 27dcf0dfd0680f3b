"""vLLM's ``repetition_penalty`` and ``min_p``, and a grammar-masked row under every sampling filter."""

from __future__ import annotations

import pytest
import torch

import s2d2.decoding.functional as F
from s2d2.config import DecodeConfig
from s2d2.decoding.logits_adjust import LogitsAdjust, adjust_logits
from s2d2.errors import ConfigError

V = 6


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    adj = LogitsAdjust.of(DecodeConfig(repetition_penalty=2.0), prompt_ids=[1, 1, 4])
    assert adj.active and adj.needs_counts and adj.prompt_ids == (1, 4)
    x = torch.tensor([[1.0, 2.0, -2.0, 3.0, -1.0, 0.5]])
    counts = torch.zeros(1, V)
    counts[0, 2] = 1  # generated once before the position
    out = adjust_logits(x, adj, counts, torch.tensor([1]))
    assert out.tolist() == [[1.0, 1.0, -4.0, 3.0, -2.0, 0.5]]


def test_min_p_keeps_tokens_within_the_ratio_of_the_most_likely():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = F.probs_from_logits(logits, 1.0, 0, 1.0, 0.4)
    assert (probs[0, :2] > 0).all() and (probs[0, 2:] == 0).all()
    assert torch.allclose(probs[0, :2], torch.tensor([0.625, 0.375]))


@pytest.mark.parametrize("filters", [(1, 1.0, 0.0), (0, 0.01, 0.0), (0, 1.0, 1.0), (2, 0.5, 0.9)])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 2.0])
def test_a_masked_row_keeps_an_allowed_token_under_every_filter(filters, temperature):
    """A grammar allowing only unlikely tokens: each filter keeps the best allowed one, never NaN."""
    logits = torch.tensor([[9.0, 8.0, -3.0, -4.0, 7.0, -5.0]])
    masked = logits.masked_fill(torch.tensor([[True, True, False, False, True, True]]), float("-inf"))
    probs = F.probs_from_logits(masked, temperature, *filters)
    assert torch.isfinite(probs).all() and probs[0, 2] > 0 and probs[0, [0, 1, 4, 5]].sum() == 0
    draw = F.sample(probs, temperature == 0, torch.Generator().manual_seed(0))
    assert int(draw) in (2, 3)


@pytest.mark.parametrize(
    "settings,match",
    [(dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"), (dict(repetition_penalty=0.0), "repetition")],
)
def test_out_of_range_settings_are_one_line_errors(settings, match):
    with pytest.raises(ConfigError, match=match) as exc:
        DecodeConfig.build(**settings)
    assert "\n" not in str(exc.value)

"""logit_bias, presence / frequency penalties and min_tokens as one pure batched logits transform."""

from __future__ import annotations

import pytest
import torch

from s2d2.config import DecodeConfig
from s2d2.decoding.logits_adjust import LogitsAdjust, adjust_logits, token_counts
from s2d2.errors import ConfigError

V = 7


def _logits(n: int = 3) -> torch.Tensor:
    return torch.arange(n * V, dtype=torch.float32).view(n, V) / 10


def test_nothing_set_is_inactive_and_the_identity():
    adj = LogitsAdjust.of(DecodeConfig(), stop_ids=[1])
    assert not adj.active and not adj.needs_counts
    x = _logits()
    assert torch.equal(adjust_logits(x, adj, None, torch.zeros(3, dtype=torch.long)), x)
    # min_tokens without any stop id to hold back changes nothing either
    assert not LogitsAdjust.of(DecodeConfig(min_tokens=5), stop_ids=[]).active


def test_penalties_and_bias_follow_openai_formula_row_by_row():
    cfg = DecodeConfig(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={3: 2.0, 6: -100.0})
    adj = LogitsAdjust.of(cfg, stop_ids=[1])
    assert adj.active and adj.needs_counts and adj.bias == ((3, 2.0), (6, -100.0))
    x = _logits()
    counts = torch.zeros(3, V)
    counts[0, 2] = 3  # row 0: token 2 three times
    counts[1, 4] = 1  # row 1: token 4 once; row 2: nothing generated
    x_before = x.clone()
    out = adjust_logits(x, adj, counts, torch.tensor([3, 1, 0]))
    assert torch.equal(x, x_before)  # the input is not modified
    want = x_before.clone()
    want[0, 2] -= 0.5 + 0.25 * 3
    want[1, 4] -= 0.5 + 0.25
    want[:, 3] += 2.0
    want[:, 6] -= 100.0
    assert torch.allclose(out, want, atol=1e-6)
    assert out.dtype == torch.float32


def test_negative_penalties_raise_repeated_tokens():
    adj = LogitsAdjust.of(DecodeConfig(frequency_penalty=-1.0))
    counts = torch.zeros(1, V)
    counts[0, 0] = 2
    out = adjust_logits(torch.zeros(1, V), adj, counts, torch.tensor([2]))
    assert out[0, 0] == 2.0 and out[0, 1:].abs().sum() == 0


def test_min_tokens_masks_stop_ids_only_while_too_few_were_generated():
    adj = LogitsAdjust.of(DecodeConfig(min_tokens=2, stop_token_ids=[5]), stop_ids=[1, 5])
    assert adj.active and not adj.needs_counts and adj.stop_ids == (1, 5)
    x = _logits()
    out = adjust_logits(x, adj, None, torch.tensor([0, 1, 2]))
    for row in (0, 1):
        assert out[row, 1] == float("-inf") and out[row, 5] == float("-inf")
        keep = [v for v in range(V) if v not in (1, 5)]
        assert torch.equal(out[row, keep], x[row, keep])
    assert torch.equal(out[2], x[2])  # two tokens generated: the stops are free again


def test_ids_outside_the_vocabulary_are_ignored():
    adj = LogitsAdjust.of(DecodeConfig(logit_bias={V + 3: 5.0, 0: 1.0}, min_tokens=1), stop_ids=[V + 1])
    out = adjust_logits(torch.zeros(2, V), adj, None, torch.tensor([0, 0]))
    assert out[:, 0].tolist() == [1.0, 1.0] and out[:, 1:].abs().sum() == 0


def test_penalties_without_counts_is_an_error():
    adj = LogitsAdjust.of(DecodeConfig(presence_penalty=1.0))
    with pytest.raises(ValueError, match="counts"):
        adjust_logits(torch.zeros(2, V), adj, None, torch.tensor([0, 0]))


def test_batched_equals_row_by_row():
    torch.manual_seed(0)
    adj = LogitsAdjust.of(
        DecodeConfig(presence_penalty=1.5, frequency_penalty=0.3, logit_bias={2: 4.0}, min_tokens=3),
        stop_ids=[1],
    )
    x = torch.randn(5, V)
    counts = torch.randint(0, 3, (5, V)).float()
    gen = torch.tensor([0, 2, 3, 4, 9])
    whole = adjust_logits(x, adj, counts, gen)
    rows = torch.cat([adjust_logits(x[i : i + 1], adj, counts[i : i + 1], gen[i : i + 1]) for i in range(5)])
    assert torch.equal(whole, rows)


def test_token_counts():
    tokens = torch.tensor([[2, 2, 5, 0], [1, 3, 3, 3]])
    valid = torch.tensor([[True, True, True, False], [False, True, True, True]])
    counts = token_counts(tokens, valid, V)
    assert counts[0].tolist() == [0, 0, 2, 0, 0, 1, 0]
    assert counts[1].tolist() == [0, 0, 0, 3, 0, 0, 0]


@pytest.mark.parametrize(
    "settings,match",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-2.01), "frequency_penalty"),
        (dict(logit_bias={3: 101.0}), r"logit_bias\[3\]"),
        (dict(logit_bias={-1: 1.0}), "logit_bias keys"),
        (dict(logit_bias={"7": 1.0}), "logit_bias keys"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=1.5), "min_tokens"),
    ],
)
def test_config_rejects_out_of_range_settings_in_one_line(settings, match):
    with pytest.raises(ConfigError, match=match) as exc:
        DecodeConfig.build(**settings)
    assert "\n" not in str(exc.value)

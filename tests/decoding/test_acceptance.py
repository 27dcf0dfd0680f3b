"""The acceptance rules and the residual resampling, on synthetic distributions."""

from __future__ import annotations

import torch

from s2d2.decoding import functional as F

P = torch.tensor([0.50, 0.30, 0.10, 0.05, 0.05])
Q = torch.tensor([0.10, 0.20, 0.40, 0.25, 0.05])


def speculative_commit(p, q, x, gen):
    """One span through the engine's rule: (accepted length, token at the first rejection or None)."""
    u = torch.rand(x.numel(), generator=gen)
    n = F.probabilistic_acceptance(F.token_probs(p, x), F.token_probs(q, x), u)
    corr = F.resample_at(p, q, n.clamp(max=x.numel() - 1), gen)
    return int(n), (int(corr) if int(n) < x.numel() else None)


def test_probabilistic_rule_is_exact_in_distribution():
    """Draft x ~ p, accept with min(1, q(x)/p(x)), else resample from norm(max(q - p, 0)): the committed
    token is distributed as q. 60,000 draws with a fixed seed; each frequency must be within 0.01 of q
    (about 4.5 standard errors) and the total variation distance below 0.01."""
    gen = torch.Generator().manual_seed(1234)
    n = 60_000
    counts = torch.zeros(5)
    p = P.view(1, -1)
    q = Q.view(1, -1)
    for _ in range(n):
        x = torch.multinomial(P, 1, generator=gen)
        n_acc, corr = speculative_commit(p, q, x.view(-1), gen)
        counts[int(x) if n_acc == 1 else corr] += 1
    freq = counts / n
    assert (freq - Q).abs().max() < 0.01, freq
    assert 0.5 * (freq - Q).abs().sum() < 0.01
    # and it is really q, not p
    assert 0.5 * (freq - P).abs().sum() > 0.3


def test_probabilistic_rule_span_first_token_follows_q():
    """In a span, the first committed token is q_0-distributed whatever happens after it."""
    gen = torch.Generator().manual_seed(7)
    p = torch.stack([P, Q, P])
    q = torch.stack([Q, P, Q])
    counts = torch.zeros(5)
    n = 30_000
    for _ in range(n):
        x = torch.multinomial(p, 1, generator=gen).view(-1)
        n_acc, corr = speculative_commit(p, q, x, gen)
        counts[int(x[0]) if n_acc >= 1 else corr] += 1
    assert ((counts / n) - Q).abs().max() < 0.015


def test_strict_rule_on_packed_spans():
    """Three spans of one batch: all accepted, first rejection at 1 (corrected to 0), at 0 (to 1)."""
    q = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]).log().repeat(3, 1)
    drafts = torch.tensor([1, 0, 1, 1, 1, 1, 0, 0, 1])
    row = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    local = torch.tensor([0, 1, 2] * 3)
    n_acc, corr = F.strict_acceptance(q, drafts, row, local, torch.tensor([3, 3, 3]))
    assert n_acc.tolist() == [3, 1, 0]
    assert corr.tolist()[1:] == [0, 1]


def test_accept_prefix_spans_of_different_lengths():
    ok = torch.tensor([True, False, True, True, True, False])
    row = torch.tensor([0, 0, 1, 2, 2, 2])
    local = torch.tensor([0, 1, 0, 0, 1, 2])
    assert F.accept_prefix(ok, row, local, torch.tensor([2, 1, 3])).tolist() == [1, 1, 2]


def test_accept_length_probabilistic_and_tempering():
    p = torch.tensor([0.5, 0.5, 0.5])
    q = torch.tensor([0.5, 0.25, 1.0])
    u = torch.tensor([0.99, 0.4, 0.0])
    # r = [1, 0.5, 2] -> accept, accept (0.4 < 0.5), accept
    assert F.probabilistic_acceptance(p, q, u).tolist() == [3]
    # tempering g = 2: r_1 = 0.25 < 0.4 -> stop after the first
    assert F.probabilistic_acceptance(p, q, u, tempering=2.0).tolist() == [1]


def test_residual_distribution():
    res = F.residual_distribution(P, Q)
    expected = (Q - P).clamp_min(0)
    torch.testing.assert_close(res, expected / expected.sum())
    # no residual mass (q == p): falls back to q
    torch.testing.assert_close(F.residual_distribution(Q, Q), Q)


def test_argmax_is_torchs_first_maximal_index_on_every_path():
    """The host path (numpy's vectorised argmax) and the device path (``max``) agree with torch's own
    argmax: ties go to the first maximal index, NaN counts as maximal, strided rows and half precision
    included; ``greedy_pick``'s probability is the value at that index."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randint(0, 3, (300, 64), generator=gen).float()  # many ties
    x[5, 10] = x[5, 40] = float("nan")
    want = x.max(dim=-1).indices
    assert torch.equal(F.argmax(x), want)
    assert F.argmax(x).dtype == torch.long
    assert torch.equal(F.argmax(x.t().contiguous().t()), want)  # strided rows
    assert torch.equal(F.argmax(x.half()), x.half().max(dim=-1).indices)
    assert torch.equal(F.argmax(x.bfloat16()), x.bfloat16().max(dim=-1).indices)  # torch's path
    assert int(F.argmax(x[0])) == int(x[0].max(dim=-1).indices)
    probs = x.softmax(-1)
    for rows in (probs, probs.repeat(120, 1)):  # one ``max`` (few values), numpy's argmax and ``amax``
        ref = rows.max(dim=-1)
        ids, vals = F.greedy_pick(rows)
        assert torch.equal(ids, ref.indices)
        assert torch.equal(vals.nan_to_num(-1.0), ref.values.nan_to_num(-1.0))

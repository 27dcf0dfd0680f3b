"""Small pure functions behind every decoder: sampling transforms, confidence and entropy, the
acceptance rules, acceptance-length estimators and scores, and the baselines' commit rules.

All functions take and return tensors of one block's candidate positions; none touch a model.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------- sampling


def probs_from_logits(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Full distributions ``[n, V]`` after temperature, top-k, top-p (nucleus) and min-p transforms.

    Temperature 0 means greedy sampling; the distribution itself is then taken at temperature 1 (it
    still feeds confidence, entropy, estimators and the probabilistic acceptance rule). Every filter
    keeps each row's most likely token, so a row with one finite logit (a grammar-masked row allows at
    least one token) keeps a finite distribution: no NaN reaches a draw.
    """
    if logits.dtype != torch.float32:  # (a float32 tensor as it is: no call)
        logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps at least one)
        drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if min_p > 0.0:
        # p >= min_p * p_max  <=>  logit >= max_logit + log(min_p) (the most likely token always stays)
        floor = logits.amax(dim=-1, keepdim=True) + math.log(min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    return torch.softmax(logits, dim=-1)


#: dtypes numpy reduces as torch does (numpy has no bfloat16)
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def _plain_host(x: torch.Tensor) -> bool:
    """Whether ``x`` is a plain tensor (no subclass) on the host, which numpy may read."""
    return type(x) is torch.Tensor and x.device.type == "cpu"


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)``, the first maximal index of each row (NaN counts as maximal).

    A plain host tensor goes through numpy's vectorised ``argmax`` (same indices, ties and NaN included;
    torch's CPU reduction that tracks indices is not vectorised); anything else (a device tensor, a
    tensor subclass, a dtype numpy lacks) through ``x.max(dim=-1)``, faster than torch's ``argmax``."""
    if _plain_host(x) and x.dtype in _NUMPY_DTYPES and not x.requires_grad:
        return torch.from_numpy(np.asarray(x.numpy().argmax(axis=-1), dtype=np.int64))
    return x.max(dim=-1).indices


#: at most this many host values, :func:`greedy_pick` takes its index and value in ONE ``max`` (cheaper than
#: numpy's argmax and an ``amax``, two calls, on few values; numpy's vectorised argmax wins on large rows)
_ONE_REDUCTION_HOST_VALUES = 1 << 14


def greedy_pick(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(argmax(probs), token_probs(probs, argmax(probs)))``: ``[n]`` each. The probability is the row's
    maximum (no gather): the same value, NaN included. On a device, or on few host values, both come from
    one ``max`` (the same first maximal index as :func:`argmax`); else numpy's argmax and an ``amax``."""
    if not _plain_host(probs) or probs.numel() <= _ONE_REDUCTION_HOST_VALUES:
        values, indices = probs.max(dim=-1)
        return indices, values
    return argmax(probs), probs.amax(dim=-1)


def sample(probs: torch.Tensor, greedy: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row: argmax when ``greedy``, else a draw from ``probs``."""
    if greedy:
        return argmax(probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def token_probs(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[i, tokens[i]]``."""
    return probs.gather(-1, tokens.view(-1, 1)).squeeze(-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) per row."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)


def normalized_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy divided by ln(vocabulary size), in [0, 1]."""
    return entropy(probs) / math.log(probs.shape[-1])


def margin(probs: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 probability per row."""
    top2 = torch.topk(probs, 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


# ---------------------------------------------------------------------------------------------- acceptance


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(q - p, 0)); falls back to q when the residual has no mass."""
    res = (q - p).clamp_min(0)
    total = res.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, res / total.clamp_min(1e-30), q)


def accept_prefix(
    ok: torch.Tensor, row: torch.Tensor, local: torch.Tensor, sizes: torch.Tensor
) -> torch.Tensor:
    """Accepted prefix length of each of R spans packed together: the index of a span's first False.

    ``ok`` ``[S]`` says position i passed its test; ``row`` / ``local`` ``[S]`` give its span and its index
    in the span; ``sizes`` ``[R]`` the spans' lengths. Returns ``[R]`` (a span with no False: its size).
    No host synchronisation.
    """
    first_bad = torch.where(ok, sizes[row], local)
    return sizes.clone().scatter_reduce(0, row, first_bad, reduce="amin")


def strict_acceptance(
    q_logits: torch.Tensor, drafts: torch.Tensor, row: torch.Tensor, local: torch.Tensor, sizes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Strict greedy rule for R packed spans: accept while ``draft == argmax q``; the correction is
    ``argmax q`` at the first mismatch (at the span's last position when all were accepted, unused).

    ``q_logits`` ``[S, V]`` (the mask token removed), ``drafts`` ``[S]``; see :func:`accept_prefix`.
    Returns ``(n_accepted [R], correction [R])``.
    """
    q_arg = argmax(q_logits)
    n_acc = accept_prefix(drafts == q_arg, row, local, sizes)
    offsets = torch.cumsum(sizes, 0) - sizes
    return n_acc, q_arg.index_select(0, offsets + torch.minimum(n_acc, sizes - 1))


def probabilistic_acceptance(
    p_draft: torch.Tensor, q_draft: torch.Tensor, uniforms: torch.Tensor, tempering: float = 1.0
) -> torch.Tensor:
    """Paper's rule: accept x_i while u_i < min(1, (q_i(x_i) / p_i(x_i))^g), left to right. ``[s]``
    probabilities and uniforms in; the accepted length as a ``[1]`` tensor out (no host sync)."""
    ratio = (q_draft / p_draft.clamp_min(1e-30)).pow(tempering).clamp(max=1.0)
    return (uniforms < ratio).long().cumprod(0).sum().view(1)


def resample_at(
    p: torch.Tensor, q: torch.Tensor, at: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw from normalize(max(q - p, 0)) at span index ``at`` (``[1]``) of ``p``, ``q`` ``[s, V]``."""
    resid = residual_distribution(p.index_select(0, at), q.index_select(0, at))
    return torch.multinomial(resid, 1, generator=generator).view(1)


# ---------------------------------------------------------------------------------------------- estimators


def acceptance_estimate(
    name: str, probs: torch.Tensor, drafts: torch.Tensor, param: float | None
) -> torch.Tensor:
    """Per-token acceptance estimate alpha_i from the drafter's distributions (docs/METHOD.md section 4)."""
    if name == "hard-margin":
        return (margin(probs) > param).float()
    if name == "hard-entropy":
        return (normalized_entropy(probs) < param).float()
    if name == "confidence-power":
        return token_probs(probs, drafts).pow(param)
    if name == "clipped-margin":
        return (param * margin(probs)).clamp(0.0, 1.0)
    if name == "soft-entropy":
        return torch.exp(-param * normalized_entropy(probs))
    if name == "renyi2":
        return probs.pow(2).sum(dim=-1)
    raise ValueError(f"unknown estimator {name!r}")


def expected_accept_length(alpha: torch.Tensor) -> float:
    """E[K] = sum_k prod_{i<=k} alpha_i."""
    return float(torch.cumprod(alpha, dim=0).sum())


def verify_score(expected_len: float, *, kind: str, penalty: float, n_dynamic: int = 0) -> float:
    """s = E[K] - c (static) or E[K] - c * n_dynamic (dynamic)."""
    return expected_len - (penalty if kind == "static" else penalty * n_dynamic)


# ---------------------------------------------------------------------------------------------- baselines


def quota(step: int, unit: int, steps: int) -> int:
    """Tokens step ``step`` must commit in a unit of ``unit`` positions decoded in ``steps`` steps."""
    steps = min(steps, unit)
    return unit // steps + (1 if step < unit % steps else 0)


def select_static(conf: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` most confident positions."""
    k = min(k, conf.numel())
    return torch.topk(conf, k).indices


def select_dynamic(conf: torch.Tensor, tau: float, k_min: int) -> torch.Tensor:
    """Every position with confidence > tau; at least the ``k_min`` most confident."""
    above = torch.nonzero(conf > tau).view(-1)
    if above.numel() >= min(k_min, conf.numel()):
        return above
    return select_static(conf, k_min)


def select_entropy_bounded(ent: torch.Tensor, gamma: float, k_min: int = 1) -> torch.Tensor:
    """Largest prefix of positions sorted by entropy whose entropy sum stays within gamma (>= k_min)."""
    order = torch.argsort(ent)
    n = int((torch.cumsum(ent[order], dim=0) <= gamma).sum())
    return order[: max(n, min(k_min, ent.numel()))]


def bin_index(value: float, lo: float, hi: float, bins: int) -> int:
    """Equal-width bin of ``value`` over [lo, hi] (clamped)."""
    if hi <= lo:
        return 0
    return min(bins - 1, max(0, int((value - lo) / (hi - lo) * bins)))

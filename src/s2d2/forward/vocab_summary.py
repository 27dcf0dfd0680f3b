"""What the device half reads of vocab-parallel logits, without gathering them: a few values a row.

Tensor-parallel ranks each hold the logits of their vocabulary slice ``[L, per]``. Gathering them to rank
0 moves ``L x vocab`` values a forward. The common steps read far less of each row: the greedy token and
its probability, the margin to the runner-up, the entropy and the sum of squared probabilities (the
acceptance estimators). Those are exact functions of a few per-slice values, so each rank reduces its
slice (:func:`local_summary`, ``[L, LOCAL_WIDTH]`` float32), rank 0 gathers ``L x LOCAL_WIDTH`` values a
rank and combines them (:func:`combine`) into the row's summary ``[L, WIDTH]`` float32:

====================  ===================================================================
column                value (of the distribution ``softmax(logits)`` over the vocabulary)
====================  ===================================================================
:data:`TOKEN`         the most likely token (the first one where several tie), as a float
:data:`PROB`          its probability
:data:`MARGIN`        its probability minus the runner-up's
:data:`ENTROPY`       the Shannon entropy (nats)
:data:`SQUARES`       the sum of squared probabilities
====================  ===================================================================

One column of the vocabulary (``exclude``: the mask token, never a prediction) counts as ``-inf``, as
do the padding columns of the last rank's slice. A step that needs more than these (sampling, structured
output, log-probabilities, logit adjustments, traces) asks for the full logits instead
(:class:`Summarized`'s ``full``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TOKEN, PROB, MARGIN, ENTROPY, SQUARES = range(5)
#: a logit no token reaches (a finite stand-in for -inf: its exponential is 0 and 0 times it is 0)
_FLOOR = -1e30
#: columns of a row's summary
WIDTH = 5
#: columns of one slice's reduction: best logit, its token, second best logit, and relative to the best
#: logit m: sum exp(x - m), sum exp(x - m) (x - m), sum exp(2 (x - m))
LOCAL_WIDTH = 6


def local_summary(local: torch.Tensor, first: int, vocab: int, exclude: int) -> torch.Tensor:
    """One slice's reduction ``[L, LOCAL_WIDTH]`` float32 of ``local`` ``[L, per]``: the logits of tokens
    ``[first, first + per)``; tokens at ``vocab`` or past it (padding) and ``exclude`` do not count."""
    x = local.float()  # (``local`` itself where it is float32: written below, then restored)
    per = x.shape[-1]
    col = exclude - first if first <= exclude < first + per else None  # (decided on the host: no sync)
    if col is not None:
        saved = x[:, col].clone()
        x[:, col] = _FLOOR
    if first + per > vocab:  # padding: never gathered as logits, so not restored
        x[:, max(vocab - first, 0) :] = _FLOOR
    best, index = x.max(dim=-1, keepdim=True)  # the first best token, as the full rows' argmax
    second = torch.topk(x, 2, dim=-1).values[:, 1:] if per > 1 else torch.full_like(best, _FLOOR)
    shifted = x - best
    e = torch.exp(shifted)
    sums = e.sum(dim=-1, keepdim=True)
    moment = torch.linalg.vecdot(e, shifted)[:, None]
    squares = torch.linalg.vecdot(e, e)[:, None]
    if col is not None:
        x[:, col] = saved
    token = (index + first).float()
    return torch.cat([best, token, second, sums, moment, squares], dim=-1)


def combine(parts: torch.Tensor) -> torch.Tensor:
    """The rows' summaries ``[L, WIDTH]`` from the slices' reductions ``parts`` ``[N, L, LOCAL_WIDTH]``
    (slice ``r`` holds lower tokens than slice ``r + 1``, so the first best slice holds the first best
    token)."""
    best, token, second = parts[..., 0], parts[..., 1], parts[..., 2]
    top, rank = best.max(dim=0)  # [L]: the best logit and the first slice holding it
    scale = torch.exp(best - top)  # [N, L]
    sums = (parts[..., 3] * scale).sum(dim=0)
    moment = ((parts[..., 4] + (best - top) * parts[..., 3]) * scale).sum(dim=0)
    squares = (parts[..., 5] * scale * scale).sum(dim=0)
    others = best.scatter(0, rank[None], float("-inf"))  # the other slices' best logits
    runner_up = torch.maximum(others.max(dim=0).values, second.gather(0, rank[None])[0])
    prob = 1.0 / sums
    out = torch.empty(parts.shape[1], WIDTH, dtype=torch.float32, device=parts.device)
    out[:, TOKEN] = token.gather(0, rank[None])[0]
    out[:, PROB] = prob
    out[:, MARGIN] = prob - torch.exp(runner_up - top) / sums
    out[:, ENTROPY] = torch.log(sums) - moment / sums
    out[:, SQUARES] = squares / (sums * sums)
    return out


class Summarized(list):
    """A forward's rows as summaries (``[n, WIDTH]`` each, one tensor a segment, as the full logits would
    be): ``full()`` gets the full logits of the same forward instead (one list, the same shapes but
    ``vocab`` columns), valid until the next forward."""

    def __init__(self, rows: list[torch.Tensor], full: Callable[[], list[torch.Tensor]]):
        super().__init__(rows)
        self.full = full

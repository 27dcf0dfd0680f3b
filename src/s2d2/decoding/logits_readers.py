"""How the decode step's math reads a batch of logits rows: the rows as one tensor (a view where they
tile the forward's output), the mask token's column removed, and the parts of rows the float32 math takes
at once; and the two readers of a row's distribution.

A reader is one of two: :data:`WHOLE_ROWS` (the forward's logits ``[S, vocab]``) or :class:`Summaries`
(the rows' summaries ``[S, WIDTH]`` a tensor-parallel forward gives: :mod:`~s2d2.forward.vocab_summary`).
Both offer the same values of a row's distribution: the greedy token, its probability, the margin, the
entropy, the squared-probability sum and the acceptance estimators built on them; only whole rows hold
the distributions themselves (sampling, alternatives, kept rows).

Logits stay in the model's dtype (bf16 on CUDA) up to here; the values read (distributions, entropies,
log-probabilities) are computed in float32 over at most :data:`FLOAT32_CHUNK_BYTES` of ``[rows, vocab]``
at a time (:func:`row_chunks`), so a step never holds a float32 copy of all its rows' logits."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..forward.vocab_summary import ENTROPY, MARGIN, PROB, SQUARES, TOKEN
from . import functional as F

#: the most bytes of float32 ``[rows, vocab]`` one part of the device half's math covers (64 MiB: 110 rows
#: of a 151,936-token vocabulary); a part holds at least one query's rows whatever its size
FLOAT32_CHUNK_BYTES = 64 << 20


def chunk_rows(vocab: int) -> int:
    """How many rows of ``vocab`` float32 values fit in :data:`FLOAT32_CHUNK_BYTES` (at least one)."""
    return max(1, FLOAT32_CHUNK_BYTES // (4 * max(vocab, 1)))


def row_chunks(sizes: Sequence[int], vocab: int) -> list[tuple[int, int, int, int]]:
    """Consecutive queries of ``sizes`` rows each, in parts of at most :func:`chunk_rows` rows (a query is
    never split; one larger than that is a part alone): ``(first query, end query, first row, end row)``
    per part. One part covering everything when all rows fit."""
    limit, total = chunk_rows(vocab), sum(sizes)
    if total <= limit:
        return [(0, len(sizes), 0, total)]
    parts: list[tuple[int, int, int, int]] = []
    q0 = r0 = r = 0
    for i, n in enumerate(sizes):
        if r + n - r0 > limit and r > r0:
            parts.append((q0, i, r0, r))
            q0, r0 = i, r
        r += n
    parts.append((q0, len(sizes), r0, r))
    return parts


def in_chunks(
    fn: Callable[[int, int], tuple[torch.Tensor, ...]], n: int, vocab: int
) -> tuple[torch.Tensor, ...]:
    """``fn(a, b)`` (tensors of rows ``a:b``, first dim ``b - a``) for all ``n`` rows, computed in parts of
    at most :func:`chunk_rows` rows and concatenated tensor by tensor (one call when they fit)."""
    limit = chunk_rows(vocab)
    if n <= limit:
        return fn(0, n)
    parts = [fn(a, min(a + limit, n)) for a in range(0, n, limit)]
    return tuple(torch.cat(same) for same in zip(*parts, strict=True))


def tiling(rows: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """The ``[n, vocab]`` view of the first row's storage that ``rows`` (``[k, vocab]`` each) tile end to
    end, in order, from its start to its end (views of the forward's logits that cover them whole: every
    row of a step that drafts, or verifies, alone), with each row's number of rows; else None. Read off
    the rows' data addresses (two calls a row): rows whose addresses follow each other through that
    storage are its memory, so the view reads (and a write through it changes) exactly their values."""
    first = rows[0]
    if first.storage_offset() != 0:
        return None
    size, vocab = first.element_size(), first.shape[-1]
    start = at = first.data_ptr()
    counts = []
    for r in rows:
        if r.data_ptr() != at or not r.is_contiguous():
            return None
        n = r.numel()
        counts.append(n // vocab)
        at += n * size
    if at - start != first.untyped_storage().nbytes():
        return None
    return first.as_strided(((at - start) // (size * vocab), vocab), (vocab, 1), 0), counts


def tiled(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor ``rows`` tile end to end (:func:`tiling`'s view), else None."""
    got = tiling(rows)
    return None if got is None else got[0]


def storage_rows(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """Every row of the one storage ``rows`` lie in, as ``[n, vocab]`` (None where they do not: other
    storages, strides, or offsets that are not whole rows)."""
    first = rows[0]
    vocab = first.shape[-1]
    storage = first.untyped_storage()
    ptr = storage.data_ptr()
    for r in rows:
        if (
            r.dim() != 2
            or r.stride() != (vocab, 1)
            or r.storage_offset() % vocab
            or r.untyped_storage().data_ptr() != ptr
        ):
            return None
    n = storage.nbytes() // (first.element_size() * vocab)
    return first.as_strided((n, vocab), (vocab, 1), 0)


def without_mask_token(
    rows: list[torch.Tensor], mask_id: int, keep_raw: bool, in_place: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's logits ``[S, vocab]`` (``rows`` stacked) and a copy with the mask token's column at
    -inf (it is never a prediction).

    ``in_place``: no query of the step reads raw logits, so the forward's logits are masked where they
    are (no copy where the rows tile them, :func:`tiled`; the mask column is -inf for every query of
    the step alike). Otherwise the stacking is a copy already and is masked in place unless the raw
    logits are still needed (``keep_raw``: log-probabilities) or there is one part (a view of the
    forward's logits, which other queries may read)."""
    if in_place:
        masked = tiled(rows) if len(rows) > 1 else rows[0]
        if masked is None:
            masked = torch.cat(rows)
        masked.select(1, mask_id).fill_(float("-inf"))
        return masked, masked
    if len(rows) == 1 or keep_raw:
        logits = torch.cat(rows) if len(rows) > 1 else rows[0]
        masked = logits.clone()
    else:
        logits = masked = torch.cat(rows)
    masked.select(1, mask_id).fill_(float("-inf"))
    return logits, masked


#: the sampling transforms of a group of rows: temperature, top-k, top-p, min-p
Key = tuple[float, int, float, float]


def transforms(config) -> Key:
    """The sampling transforms ``config`` (a request's decode config) draws under."""
    return (config.temperature, config.top_k, config.top_p, config.min_p)


class ProbRows:
    """Values of whole rows' distributions ``probs`` ``[S, vocab]`` (float32)."""

    def __init__(self, probs: torch.Tensor):
        self.probs = probs

    def greedy(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's most likely token and its probability, ``[S]`` each."""
        return F.greedy_pick(self.probs)

    def margin(self) -> torch.Tensor:
        return F.margin(self.probs)

    def entropy(self) -> torch.Tensor:
        return F.entropy(self.probs)

    def norm_entropy(self) -> torch.Tensor:
        return F.normalized_entropy(self.probs)

    def squares(self) -> torch.Tensor:
        return self.probs.pow(2).sum(dim=-1)

    def acceptance(self, name: str, drafts: torch.Tensor, param: float | None) -> torch.Tensor:
        """:func:`~s2d2.decoding.functional.acceptance_estimate` ``name`` of ``drafts`` ``[S]``."""
        return F.acceptance_estimate(name, self.probs, drafts, param)


class SummaryRows:
    """The same values as :class:`ProbRows`, read off the summaries ``rows`` ``[S, WIDTH]`` of the greedy
    drafts' rows (``vocab``: the distribution's width, for the normalised entropy); no distributions."""

    probs = None

    def __init__(self, rows: torch.Tensor, vocab: int):
        self.rows, self.vocab = rows, vocab

    def greedy(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows[:, TOKEN].long(), self.rows[:, PROB].clone()

    def margin(self) -> torch.Tensor:
        return self.rows[:, MARGIN].clone()

    def entropy(self) -> torch.Tensor:
        return self.rows[:, ENTROPY].clone()

    def norm_entropy(self) -> torch.Tensor:
        return self.rows[:, ENTROPY] / math.log(self.vocab)

    def squares(self) -> torch.Tensor:
        return self.rows[:, SQUARES].clone()

    def acceptance(self, name: str, drafts: torch.Tensor | None, param: float | None) -> torch.Tensor:
        """:meth:`ProbRows.acceptance` of the greedy drafts (``drafts`` is not read)."""
        r = self.rows
        if name == "hard-margin":
            return (r[:, MARGIN] > param).float()
        if name == "hard-entropy":
            return (self.norm_entropy() < param).float()
        if name == "confidence-power":
            return r[:, PROB].pow(param)
        if name == "clipped-margin":
            return (param * r[:, MARGIN]).clamp(0.0, 1.0)
        if name == "soft-entropy":
            return torch.exp(-param * r[:, ENTROPY] / math.log(self.vocab))
        if name == "renyi2":
            return self.squares()
        raise ValueError(f"unknown estimator {name!r}")


class WholeRows:
    """The reader of the forward's logits ``[S, vocab]``."""

    whole = True

    def prepare(
        self, rows: list[torch.Tensor], mask_id: int, keep_raw: bool, in_place: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows stacked, raw and without the mask token (:func:`without_mask_token`)."""
        return without_mask_token(rows, mask_id, keep_raw, in_place)

    def tokens(self, masked: torch.Tensor, key: Key | None = None) -> torch.Tensor:
        """Each row's most likely token ``[S]``: of the logits, or of the distribution under ``key``."""
        return F.argmax(masked) if key is None else greedy_tokens(masked, key)

    def read(self, masked: torch.Tensor, key: Key) -> ProbRows:
        """The rows' distributions under the transforms ``key`` (float32)."""
        return ProbRows(F.probs_from_logits(masked, *key))


class Summaries:
    """The reader of the rows' summaries ``[S, WIDTH]`` (greedy rows without filters, adjustments or a
    grammar: the traits' ``summaries``), for a model of ``vocab`` tokens."""

    whole = False

    def __init__(self, vocab: int):
        self.vocab = vocab

    def prepare(
        self, rows: list[torch.Tensor], mask_id: int, keep_raw: bool, in_place: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The summaries stacked (the mask token is excluded from them already)."""
        stacked = torch.cat(rows) if len(rows) > 1 else rows[0]
        return stacked, stacked

    def tokens(self, rows: torch.Tensor, key: Key | None = None) -> torch.Tensor:
        """Each row's greedy token ``[S]`` (the same under any transforms of a greedy row)."""
        return rows[:, TOKEN].long()

    def read(self, rows: torch.Tensor, key: Key) -> SummaryRows:
        return SummaryRows(rows, self.vocab)


#: the step's usual reader
WHOLE_ROWS = WholeRows()
#: either reader
Reader = WholeRows | Summaries


def greedy_tokens(rows: torch.Tensor, key: Key) -> torch.Tensor:
    """The argmax of each row's distribution under the transforms ``key`` (``[n]``), in the parts the
    float32 math takes at once (:func:`in_chunks`; one part: the rows as they are)."""
    n = rows.shape[0]

    def part(a: int, b: int) -> tuple[torch.Tensor]:
        return (F.argmax(F.probs_from_logits(rows if b - a == n else rows[a:b], *key)),)

    return in_chunks(part, n, rows.shape[-1])[0]

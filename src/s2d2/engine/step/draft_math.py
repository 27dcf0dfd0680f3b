"""Drafting on the device: the drafter's tokens, probabilities and the values routing reads, for every row
that drafts (or edits) this step, rows with the same sampling transforms in one softmax (draws from each
request's own generator, so a row's values never depend on its batch-mates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...decoding import functional as F
from ...decoding.logits_readers import WHOLE_ROWS, Key, ProbRows, Reader, SummaryRows, row_chunks, transforms
from ..draft_step import SlotDrafts
from ..request import Request
from .adjusted import adjusted
from .device import DeviceOps, Fetch


@dataclass
class DraftQuery:
    """Draft (or edit) ``slots`` of one row from ``rows`` ``[len(slots), vocab]`` of its logits.

    Flags say which values besides the drawn token and its probability the host needs.
    """

    req: Request
    rows: torch.Tensor
    slots: list[int]
    entropy: bool = False
    norm_entropy: bool = False
    alpha: bool = False
    #: how many most likely tokens to rank per slot (fused verification's correction branches)
    alternatives: int = 0
    #: keep the distributions on the device (a probabilistic verification will need them)
    keep_probs: bool = False
    #: OpenAI logit adjustments (``req.adjust``): each row's absolute position and the generated tokens
    #: its context holds (from the first generated position on; the mask token where undecided)
    positions: list[int] | None = None
    context: list[int] | None = None
    #: structured output: host int32 grammar bitmask of the first rows (``[k, words]``), and its rows of
    #: the step's one device bitmask (set by :func:`~.device_math.run_queries`)
    grammar_bits: torch.Tensor | None = None
    grammar_dev: torch.Tensor | None = None
    result: SlotDrafts | None = None


def by_transforms(queries: Sequence[DraftQuery]) -> list[list[DraftQuery]]:
    """The queries with slots, grouped by sampling transforms (in order of first appearance)."""
    groups: dict[Key, list[DraftQuery]] = {}
    for q in queries:
        if q.slots:
            groups.setdefault(transforms(q.req.config), []).append(q)
    return list(groups.values())


def _draw(
    dist: ProbRows | SummaryRows, queries: list[DraftQuery], sizes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its probability ``[rows]`` each: the greedy token for greedy rows, else a
    draw from each row's own generator. The queries share their sampling transforms, so greedy is all or
    none."""
    if queries[0].req.greedy:
        return dist.greedy()
    probs = dist.probs
    parts = probs.split(sizes)
    drafts = torch.cat(
        [F.sample(p, q.req.greedy, q.req.generator) for p, q in zip(parts, queries, strict=True)]
    )
    return drafts, F.token_probs(probs, drafts)


@dataclass
class DraftGroup:
    """Queries sharing sampling transforms, and the indices of their device values in the step's fetch."""

    queries: list[DraftQuery]
    keys: dict[str, int]
    #: widths of the per-row values with several entries a row (alternatives, top log-probabilities)
    alternatives: int = 0
    top: int = 0


@dataclass(frozen=True)
class _Wants:
    """What a group's queries ask besides the drawn token and its probability."""

    entropy: bool
    norm_entropy: bool
    estimators: tuple[tuple, ...]
    alternatives: int
    logprobs: int | None
    key: Key


def draft_group(
    queries: list[DraftQuery], dev: DeviceOps, fetch: Fetch, in_place: bool, reader: Reader = WHOLE_ROWS
) -> DraftGroup:
    """Register the device values of queries sharing sampling transforms (read back by
    :func:`read_group`), their rows read by ``reader``; ``in_place``: see
    :func:`~s2d2.decoding.logits_readers.without_mask_token`. The float32 math runs over parts of the rows
    (:func:`~s2d2.decoding.logits_readers.row_chunks`; one part where they fit)."""
    first = queries[0].req
    mask_id = first.info.mask_token_id
    sizes, k, m = [], None, 0
    entropy = norm_entropy = False
    estimators: dict[tuple, None] = {}
    for q in queries:
        sizes.append(len(q.slots))
        cfg = q.req.config
        if cfg.logprobs is not None and (k is None or cfg.logprobs > k):
            k = cfg.logprobs
        entropy, norm_entropy = entropy or q.entropy, norm_entropy or q.norm_entropy
        m = max(m, q.alternatives)
        if q.alpha:
            estimators[(cfg.estimator, cfg.estimator_value)] = None
    wants = _Wants(entropy, norm_entropy, tuple(estimators), m, k, transforms(first.config))
    rows = [adjusted(dev, q, q.rows) for q in queries]
    logits, masked = reader.prepare(rows, mask_id, k is not None, in_place)
    chunks = row_chunks(sizes, masked.shape[-1])
    if len(chunks) == 1:
        values = _values(queries, sizes, logits, masked, wants, reader)
    else:
        parts = [
            _values(queries[q0:q1], sizes[q0:q1], logits[a:b], masked[a:b], wants, reader)
            for q0, q1, a, b in chunks
        ]
        values = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    keys = {name: fetch.add(t) for name, t in values.items()}
    return DraftGroup(queries, keys, m, k or 0)


def _values(
    queries: list[DraftQuery],
    sizes: list[int],
    logits: torch.Tensor,
    masked: torch.Tensor,
    wants: _Wants,
    reader: Reader,
) -> dict[str, torch.Tensor]:
    """The device values of ``queries`` (rows ``[sum(sizes), ...]`` of ``logits`` and ``masked``, as
    ``reader`` prepared them), by key, in float32; a query that keeps its distributions gets them here
    (whole rows only, as do sampling, alternatives and log-probabilities)."""
    dist = reader.read(masked, wants.key)
    drafts, conf = _draw(dist, queries, sizes)
    out = {"drafts": drafts, "conf": conf}
    if wants.entropy:
        out["entropy"] = dist.entropy()
    if wants.norm_entropy:
        out["norm_entropy"] = dist.norm_entropy()
    for est in wants.estimators:
        out[f"alpha:{est}"] = dist.acceptance(est[0], drafts, est[1])
    probs = dist.probs
    if wants.alternatives:
        out["alternatives"] = torch.topk(probs, min(wants.alternatives, probs.shape[-1]), dim=-1).indices
    if wants.logprobs is not None:
        lsm = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        out["logprob"] = lsm.gather(-1, drafts.view(-1, 1)).view(-1)
        if wants.logprobs:
            top = torch.topk(lsm, wants.logprobs, dim=-1)
            out["top_ids"], out["top_lp"] = top.indices, top.values
    at = 0
    for q, n in zip(queries, sizes, strict=True):
        if q.keep_probs:
            q.result = SlotDrafts(q.slots, [], [], probs=probs[at : at + n])
        at += n
    return out


def read_group(group: DraftGroup, fetch: Fetch) -> None:
    """Fill every query of ``group`` with its host values (its rows of the group's fetched tensors)."""
    keys = group.keys
    drafts, conf = fetch.ints(keys["drafts"]), fetch.get(keys["conf"])
    at = 0
    for q in group.queries:
        n = len(q.slots)
        hi = at + n
        res = SlotDrafts(q.slots, drafts[at:hi], conf[at:hi])
        if q.result is not None:
            res.probs = q.result.probs
        if q.entropy:
            res.entropy = fetch.get(keys["entropy"])[at:hi]
        if q.norm_entropy:
            res.norm_entropy = fetch.get(keys["norm_entropy"])[at:hi]
        cfg = q.req.config
        if q.alpha:
            res.alpha = fetch.get(keys[f"alpha:{(cfg.estimator, cfg.estimator_value)}"])[at:hi]
        if q.alternatives:
            w = group.alternatives
            flat = fetch.get(keys["alternatives"])[at * w : hi * w]
            res.alternatives = [[int(t) for t in flat[i * w : (i + 1) * w]] for i in range(n)]
        if cfg.logprobs is not None:
            res.logprob = fetch.get(keys["logprob"])[at:hi]
            res.top = _tops(fetch, keys, group.top, cfg.logprobs, at, n)
        q.result = res
        at = hi


def _tops(
    fetch: Fetch, keys: dict[str, int], width: int, k: int, at: int, n: int
) -> list[tuple[tuple[int, float], ...]]:
    if not k:
        return [()] * n
    ids = fetch.get(keys["top_ids"])[at * width : (at + n) * width]
    lps = fetch.get(keys["top_lp"])[at * width : (at + n) * width]
    return [tuple((int(ids[i * width + j]), lps[i * width + j]) for j in range(k)) for i in range(n)]

"""The device half of a decode step: everything computed from a forward's logits, batched over rows.

After each forward the host half (:mod:`.step`) describes what every row needs from its logits as
queries (:class:`DraftQuery` for drafting or editing slots, :class:`VerifyQuery` for an AR-mode check of
a drafted span); :func:`run_queries` computes them all as batched tensor operations on the model's
device (rows with the same sampling transforms share one softmax; draws use each request's own
generator, so a row's values never depend on its batch-mates) and brings the small results back in ONE
transfer (:meth:`~.device.DeviceOps.to_host`). Logits never leave the device.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..constraints.bitmask import masked_rows
from ..decoding import functional as F
from ..decoding.logits_adjust import adjust_logits, token_counts
from .device import DeviceOps
from .draft_step import SlotDrafts
from .request import Request


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
    #: the step's one device bitmask (set by :func:`run_queries`)
    grammar_bits: torch.Tensor | None = None
    grammar_dev: torch.Tensor | None = None
    result: SlotDrafts | None = None


@dataclass
class VerifyQuery:
    """Check ``drafts`` (at consecutive span positions) against the AR-mode logits ``q_rows``
    ``[len(drafts), vocab]``; ``p_rows`` are the drafter's distributions there (probabilistic rule)."""

    req: Request
    q_rows: torch.Tensor
    drafts: list[int]
    strict: bool
    p_rows: torch.Tensor | None = None
    positions: list[int] | None = None
    context: list[int] | None = None
    #: structured output: the grammar bitmask of every span position (host; see :class:`DraftQuery`)
    grammar_bits: torch.Tensor | None = None
    grammar_dev: torch.Tensor | None = None
    n_accepted: int = 0
    correction: int | None = None
    #: the AR-mode probability of each committed token (accepted drafts, then the correction); tracing
    q_probs: list[float] = field(default_factory=list)
    #: raw log-probabilities of the committed tokens, and their alternatives (``config.logprobs``)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    #: the drafter's probability of the correction (tracing, where ``p_rows`` are kept)
    p_correction: float | None = None
    _p_correction_key: int | None = None

    def wants_p_correction(self) -> bool:
        return self.p_rows is not None and self.req.tracer.steps is not None


class _Fetch:
    """Tensors waiting for the step's one transfer; each registration returns its index."""

    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []
        self.values: list[list[float]] = []
        self._ints: dict[int, list[int]] = {}

    def add(self, t: torch.Tensor) -> int:
        self.parts.append(t)
        return len(self.parts) - 1

    def get(self, i: int) -> list[float]:
        return self.values[i]

    def ints(self, i: int) -> list[int]:
        """Part ``i`` as ints (token ids), converted once however many queries read it."""
        if i not in self._ints:
            self._ints[i] = list(map(int, self.values[i]))
        return self._ints[i]


def _tiled(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor ``rows`` tile end to end, in order, when they do (views of the forward's logits that
    cover them whole: every row of a step that drafts, or verifies, alone), else None."""
    first = rows[0]
    if first.storage_offset() != 0:
        return None
    storage, at = first.untyped_storage().data_ptr(), 0
    for r in rows:
        if r.storage_offset() != at or not r.is_contiguous() or r.untyped_storage().data_ptr() != storage:
            return None
        at += r.numel()
    if at * first.element_size() != first.untyped_storage().nbytes():
        return None
    vocab = first.shape[-1]
    return first.as_strided((at // vocab, vocab), (vocab, 1), 0)


def _without_mask_token(
    rows: list[torch.Tensor], mask_id: int, keep_raw: bool, in_place: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's logits ``[S, vocab]`` (``rows`` stacked) and a copy with the mask token's column at
    -inf (it is never a prediction).

    ``in_place``: no query of the step reads raw logits, so the forward's logits are masked where they
    are (no copy where the rows tile them, :func:`_tiled`; the mask column is -inf for every query of
    the step alike). Otherwise the stacking is a copy already and is masked in place unless the raw
    logits are still needed (``keep_raw``: log-probabilities) or there is one part (a view of the
    forward's logits, which other queries may read)."""
    if in_place:
        masked = _tiled(rows) if len(rows) > 1 else rows[0]
        if masked is None:
            masked = torch.cat(rows)
        masked[:, mask_id] = float("-inf")
        return masked, masked
    if len(rows) == 1 or keep_raw:
        logits = torch.cat(rows) if len(rows) > 1 else rows[0]
        masked = logits.clone()
    else:
        logits = masked = torch.cat(rows)
    masked[:, mask_id] = float("-inf")
    return logits, masked


def _adjusted(dev: DeviceOps, q: DraftQuery | VerifyQuery, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` after the request's grammar mask (structured output: forbidden tokens at -inf) and its
    logit adjustments (:mod:`~s2d2.decoding.logits_adjust`): bias, penalties counted over the generated
    tokens before each row's position, ``min_tokens``."""
    if q.grammar_dev is not None:
        rows = masked_rows(rows, q.grammar_dev)
    if q.positions is None:
        return rows
    req, adjust = q.req, q.req.adjust
    before = [p - req.n_prompt for p in q.positions]
    counts = None
    if adjust.needs_counts:
        n, T = len(before), len(q.context)
        tokens = dev.tensor(q.context).expand(n, T)
        reach = dev.arange(T).view(1, T) < dev.tensor(before).view(n, 1)
        counts = token_counts(tokens, reach & (tokens != req.info.mask_token_id), rows.shape[-1])
    return adjust_logits(rows, adjust, counts, dev.tensor(before))


def _transforms(req: Request) -> tuple[float, int, float]:
    c = req.config
    return (c.temperature, c.top_k, c.top_p)


def _by_transforms(queries: Sequence[DraftQuery]) -> list[list[DraftQuery]]:
    """The queries with slots, grouped by sampling transforms (in order of first appearance)."""
    groups: dict[tuple[float, int, float], list[DraftQuery]] = {}
    for q in queries:
        if q.slots:
            c = q.req.config
            key = (c.temperature, c.top_k, c.top_p)
            if key in groups:
                groups[key].append(q)
            else:
                groups[key] = [q]
    return list(groups.values())


def _draw(
    probs: torch.Tensor, queries: list[DraftQuery], sizes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its probability ``[rows]`` each: argmax for greedy rows, else a draw from
    each row's own generator. The queries share their sampling transforms, so greedy is all or none."""
    if queries[0].req.greedy:
        return F.greedy_pick(probs)
    parts = probs.split(sizes)
    drafts = torch.cat(
        [F.sample(p, q.req.greedy, q.req.generator) for p, q in zip(parts, queries, strict=True)]
    )
    return drafts, F.token_probs(probs, drafts)


@dataclass
class _DraftGroup:
    """Queries sharing sampling transforms, and the indices of their device values in the step's fetch."""

    queries: list[DraftQuery]
    keys: dict[str, int]
    #: widths of the per-row values with several entries a row (alternatives, top log-probabilities)
    alternatives: int = 0
    top: int = 0


def _draft_group(queries: list[DraftQuery], dev: DeviceOps, fetch: _Fetch, in_place: bool) -> _DraftGroup:
    """Register the device values of queries sharing sampling transforms (read back by
    :func:`_read_group`); ``in_place``: see :func:`_without_mask_token`."""
    first = queries[0].req
    temperature, top_k, top_p = _transforms(first)
    mask_id = first.info.mask_token_id
    sizes, k, m = [], None, 0
    entropy = norm_entropy = keep = False
    estimators: dict[tuple, None] = {}
    for q in queries:
        sizes.append(len(q.slots))
        cfg = q.req.config
        if cfg.logprobs is not None and (k is None or cfg.logprobs > k):
            k = cfg.logprobs
        entropy, norm_entropy = entropy or q.entropy, norm_entropy or q.norm_entropy
        keep = keep or q.keep_probs
        m = max(m, q.alternatives)
        if q.alpha:
            estimators[(cfg.estimator, cfg.estimator_value)] = None
    rows = [_adjusted(dev, q, q.rows) for q in queries]
    logits, masked = _without_mask_token(rows, mask_id, k is not None, in_place)
    probs = F.probs_from_logits(masked, temperature, top_k, top_p)
    drafts, conf = _draw(probs, queries, sizes)
    keys = {"drafts": fetch.add(drafts), "conf": fetch.add(conf)}
    if entropy:
        keys["entropy"] = fetch.add(F.entropy(probs))
    if norm_entropy:
        keys["norm_entropy"] = fetch.add(F.normalized_entropy(probs))
    for est in estimators:
        keys[f"alpha:{est}"] = fetch.add(F.acceptance_estimate(est[0], probs, drafts, est[1]))
    if m:
        keys["alternatives"] = fetch.add(torch.topk(probs, min(m, probs.shape[-1]), dim=-1).indices)
    if k is not None:
        lsm = torch.log_softmax(logits.float(), dim=-1)
        keys["logprob"] = fetch.add(lsm.gather(-1, drafts.view(-1, 1)).view(-1))
        if k:
            top = torch.topk(lsm, k, dim=-1)
            keys["top_ids"], keys["top_lp"] = fetch.add(top.indices), fetch.add(top.values)
    if keep:
        at = 0
        for q, n in zip(queries, sizes, strict=True):
            if q.keep_probs:
                q.result = SlotDrafts(q.slots, [], [], probs=probs[at : at + n])
            at += n
    return _DraftGroup(queries, keys, m, k or 0)


def _read_group(group: _DraftGroup, fetch: _Fetch) -> None:
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
    fetch: _Fetch, keys: dict[str, int], width: int, k: int, at: int, n: int
) -> list[tuple[tuple[int, float], ...]]:
    if not k:
        return [()] * n
    ids = fetch.get(keys["top_ids"])[at * width : (at + n) * width]
    lps = fetch.get(keys["top_lp"])[at * width : (at + n) * width]
    return [tuple((int(ids[i * width + j]), lps[i * width + j]) for j in range(k)) for i in range(n)]


def _verify_strict(
    queries: list[VerifyQuery], dev: DeviceOps, fetch: _Fetch, in_place: bool
) -> list[dict[str, int]]:
    """Strict rule for many rows at once: accepted prefix where draft == argmax q, correction = argmax q
    at the first mismatch.

    Where no query asks for per-position values (traces, log-probabilities), only ``argmax q`` of every
    span position is registered (``q_arg``, ``[S]``) and each row's prefix and correction are read off
    it on the host (:func:`_read_verifications`): the drafts are host values already, and this spares
    the device a dozen small operations. Otherwise the prefix and correction are computed on the device
    too (the per-position values are gathered at the committed tokens) and registered per row."""
    mask_id = queries[0].req.info.mask_token_id
    raw = any(q.req.config.logprobs is not None for q in queries)
    rows = [_adjusted(dev, q, q.q_rows) for q in queries]
    logits, masked = _without_mask_token(rows, mask_id, raw, in_place)
    if not raw and all(q.req.tracer.steps is None for q in queries):
        return [{"q_arg": fetch.add(F.argmax(masked))}] * len(queries)
    sizes = [len(q.drafts) for q in queries]
    host_drafts: list[int] = []
    row_of: list[int] = []
    local: list[int] = []
    for r, q in enumerate(queries):
        host_drafts += q.drafts
        row_of += [r] * len(q.drafts)
        local += range(len(q.drafts))
    drafts = dev.tensor(host_drafts)
    if len(queries) == 1:  # one span: its prefix directly (no packing to undo)
        n = sizes[0]
        q_arg = F.argmax(masked)
        first = (drafts == q_arg).long().cumprod(0).sum().view(1)
        local_at = torch.clamp(first, max=n - 1)
        correction = q_arg.index_select(0, local_at)
        index = None
    else:
        index = dev.tensor(row_of + local).view(2, -1)
        size = dev.tensor(sizes)
        first, correction = F.strict_acceptance(masked, drafts, index[0], index[1], size)
        local_at = torch.minimum(first, size - 1)
    keys = {"n_acc": fetch.add(first), "correction": fetch.add(correction)}
    for r, q in enumerate(queries):
        if q.wants_p_correction():
            row = q.p_rows.index_select(0, local_at[r : r + 1])
            q._p_correction_key = fetch.add(row.gather(1, correction[r : r + 1].view(1, 1)))

    def committed() -> torch.Tensor:
        if index is None:
            return torch.where(dev.arange(sizes[0]) == first, correction, drafts)
        return torch.where(index[1] == first[index[0]], correction[index[0]], drafts)

    _register_q_values(queries, logits, lambda: torch.softmax(masked.float(), dim=-1), committed, keys, fetch)
    return [keys] * len(queries)


def _register_q_values(
    queries: list[VerifyQuery],
    logits: torch.Tensor,
    q_dist: Callable[[], torch.Tensor],
    committed_fn: Callable[[], torch.Tensor],
    keys: dict[str, int],
    fetch: _Fetch,
) -> None:
    """Per span position: the AR-mode probability under ``q_dist()`` (tracing) and the raw
    log-probability (``logprobs``) of the token committed there if the position is reached (the draft,
    or the correction at the first rejection). ``committed_fn`` makes those tokens only when needed."""
    tracing = any(q.req.tracer.steps is not None for q in queries)
    k = max((q.req.config.logprobs for q in queries if q.req.config.logprobs is not None), default=None)
    if not tracing and k is None:
        return
    committed = committed_fn()
    if tracing:
        keys["q_prob"] = fetch.add(q_dist().gather(-1, committed.view(-1, 1)))
    if k is not None:
        lsm = torch.log_softmax(logits.float(), dim=-1)
        keys["logprob"] = fetch.add(lsm.gather(-1, committed.view(-1, 1)))
        if k:
            top = torch.topk(lsm, k, dim=-1)
            keys["top_ids"], keys["top_lp"] = fetch.add(top.indices), fetch.add(top.values)
        keys["_k"] = k


def _verify_probabilistic(q: VerifyQuery, dev: DeviceOps, fetch: _Fetch) -> dict[str, int]:
    """The speculative-sampling rule for one row: accept x_i while u_i < min(1, (q_i/p_i)^g); at the
    first rejection draw from normalize(max(q - p, 0)). Draws come from the row's own generator."""
    req = q.req
    c = req.config
    n = len(q.drafts)
    adjusted = _adjusted(dev, q, q.q_rows)
    masked = adjusted.clone()
    masked[:, req.info.mask_token_id] = float("-inf")
    probs = F.probs_from_logits(masked, c.temperature, c.top_k, c.top_p)
    drafts = dev.tensor(q.drafts)
    uniforms = dev.rand(n, req.generator)
    p_tok, q_tok = F.token_probs(q.p_rows, drafts), F.token_probs(probs, drafts)
    first = F.probabilistic_acceptance(p_tok, q_tok, uniforms, c.tempering)
    at = torch.clamp(first, max=n - 1)
    correction = F.resample_at(q.p_rows, probs, at, req.generator)
    keys = {"n_acc": fetch.add(first), "correction": fetch.add(correction)}
    if q.wants_p_correction():
        q._p_correction_key = fetch.add(q.p_rows.index_select(0, at).gather(1, correction.view(1, 1)))
    def committed() -> torch.Tensor:
        return torch.where(dev.arange(n) == first, correction, drafts)

    _register_q_values([q], adjusted, lambda: probs, committed, keys, fetch)
    return keys


@torch.inference_mode()
def run_queries(
    dev: DeviceOps,
    edits: Sequence[DraftQuery],
    drafts: Sequence[DraftQuery],
    verifies: Sequence[VerifyQuery],
) -> None:
    """Compute every query on the device, then fill their results from ONE transfer (see the module).

    Edits are drawn before drafts, so a row that edits and drafts in one step draws in that order. Where
    no query asks for log-probabilities, the forward's logits are masked in place (no copy where the rows
    tile them; the forward's logits are read by this step's queries alone)."""
    fetch = _Fetch()
    batches = (edits, drafts, verifies)
    _upload_grammar(dev, batches)
    in_place = not any(q.req.config.logprobs is not None for batch in batches for q in batch)
    pending = [
        _draft_group(g, dev, fetch, in_place) for batch in (edits, drafts) for g in _by_transforms(batch)
    ]
    strict = [q for q in verifies if q.strict]
    checks = list(zip(strict, _verify_strict(strict, dev, fetch, in_place), strict=True)) if strict else []
    checks += [(q, _verify_probabilistic(q, dev, fetch)) for q in verifies if not q.strict]
    if not fetch.parts:
        return
    fetch.values = dev.to_host(fetch.parts)
    for group in pending:
        _read_group(group, fetch)
    _read_verifications(checks, fetch)


def _upload_grammar(dev: DeviceOps, batches: Sequence[Sequence[DraftQuery | VerifyQuery]]) -> None:
    """Every query's host grammar bitmask in ONE host-to-device copy; each query gets its rows (a view)."""
    constrained = [q for batch in batches for q in batch if q.grammar_bits is not None]
    if not constrained:
        return
    parts = [q.grammar_bits for q in constrained]
    bits = dev.from_host(torch.cat(parts) if len(parts) > 1 else parts[0])
    at = 0
    for q in constrained:
        n = q.grammar_bits.shape[0]
        q.grammar_dev = bits[at : at + n]
        at += n


def _read_verifications(checks: list[tuple[VerifyQuery, dict[str, int]]], fetch: _Fetch) -> None:
    """Fill each verification from its keys' fetched values. Queries registered together (the strict
    ones) share one ``keys`` and come consecutively, row after row, in registration order."""
    for _, run in itertools.groupby(checks, key=lambda check: id(check[1])):
        pairs = list(run)
        group, keys = [q for q, _ in pairs], pairs[0][1]
        if "q_arg" in keys:  # the strict rule on the host: accept up to the first draft that is not argmax q
            q_arg, p = fetch.ints(keys["q_arg"]), 0
            for q in group:
                n = len(q.drafts)
                q.n_accepted = next((i for i in range(n) if q.drafts[i] != q_arg[p + i]), n)
                q.correction = q_arg[p + q.n_accepted] if q.n_accepted < n else None
                p += n
        else:
            _read_device_checks(group, keys, fetch)


def _read_device_checks(group: list[VerifyQuery], keys: dict[str, int], fetch: _Fetch) -> None:
    """Fill verifications registered together with per-row values computed on the device (accepted
    length, correction) and, where asked, per-position values (AR probabilities, log-probabilities)."""
    n_acc, corrections = fetch.get(keys["n_acc"]), fetch.get(keys["correction"])
    q_probs = fetch.get(keys["q_prob"]) if "q_prob" in keys else None
    logprobs = fetch.get(keys["logprob"]) if "logprob" in keys else None
    p = 0
    for r, q in enumerate(group):
        n = len(q.drafts)
        q.n_accepted = int(n_acc[r])
        reached = min(q.n_accepted + 1, n)
        q.correction = int(corrections[r]) if q.n_accepted < n else None
        if q._p_correction_key is not None:
            q.p_correction = fetch.get(q._p_correction_key)[0]
        if q_probs is not None:
            q.q_probs = q_probs[p : p + reached]
        if logprobs is not None:
            q.logprobs = logprobs[p : p + reached]
            k, want = keys["_k"], q.req.config.logprobs or 0
            if want:
                ids, lps = fetch.get(keys["top_ids"]), fetch.get(keys["top_lp"])
                q.top = [
                    tuple((int(ids[(p + i) * k + j]), lps[(p + i) * k + j]) for j in range(want))
                    for i in range(reached)
                ]
            else:
                q.top = [()] * reached
        p += n

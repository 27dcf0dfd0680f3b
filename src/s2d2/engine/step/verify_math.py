"""Verification on the device: the AR-mode check of drafted spans (the strict rule for many rows at once,
the speculative-sampling rule row by row) and the per-position values a trace or log-probabilities ask
for; and reading the results back from the step's one transfer."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...decoding import functional as F
from ...decoding.logits_readers import WHOLE_ROWS, Reader, in_chunks, transforms, without_mask_token
from ..request import Request
from .adjusted import adjusted
from .device import DeviceOps, Fetch


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
    #: structured output: the grammar bitmask of every span position (host; see ``DraftQuery``)
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


def verify_strict(
    queries: list[VerifyQuery], dev: DeviceOps, fetch: Fetch, in_place: bool, reader: Reader = WHOLE_ROWS
) -> list[dict[str, int]]:
    """Strict rule for many rows at once: accepted prefix where draft == argmax q, correction = argmax q
    at the first mismatch.

    Where no query asks for per-position values (traces, log-probabilities), only ``argmax q`` of every
    span position is registered (``q_arg``, ``[S]``) and each row's prefix and correction are read off
    it on the host (:func:`read_verifications`): the drafts are host values already, and this spares
    the device a dozen small operations. Otherwise the prefix and correction are computed on the device
    too (the per-position values are gathered at the committed tokens) and registered per row. The rows
    are read by ``reader`` (the summaries reader's rows never ask for per-position values)."""
    mask_id = queries[0].req.info.mask_token_id
    raw = any(q.req.config.logprobs is not None for q in queries)
    rows = [adjusted(dev, q, q.q_rows) for q in queries]
    if not raw and all(q.req.tracer.steps is None for q in queries):
        q_arg = reader.tokens(reader.prepare(rows, mask_id, False, in_place)[1])
        return [{"q_arg": fetch.add(q_arg)}] * len(queries)
    logits, masked = without_mask_token(rows, mask_id, raw, in_place)
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

    def q_dist(a: int, b: int) -> torch.Tensor:
        return torch.softmax(masked[a:b], dim=-1, dtype=torch.float32)

    _register_q_values(queries, logits, q_dist, committed, keys, fetch)
    return [keys] * len(queries)


def _register_q_values(
    queries: list[VerifyQuery],
    logits: torch.Tensor,
    q_dist: Callable[[int, int], torch.Tensor],
    committed_fn: Callable[[], torch.Tensor],
    keys: dict[str, int],
    fetch: Fetch,
) -> None:
    """Per span position: the AR-mode probability under ``q_dist(a, b)`` (the float32 distributions of
    positions ``a:b``; tracing) and the raw log-probability (``logprobs``) of the token committed there
    if the position is reached (the draft, or the correction at the first rejection). ``committed_fn``
    makes those tokens only when needed. Float32 values are made over parts of the positions
    (:func:`~s2d2.decoding.logits_readers.in_chunks`), never for all of them at once when they do not fit."""
    tracing = any(q.req.tracer.steps is not None for q in queries)
    k = max((q.req.config.logprobs for q in queries if q.req.config.logprobs is not None), default=None)
    if not tracing and k is None:
        return
    committed = committed_fn().view(-1, 1)
    n, vocab = logits.shape
    if tracing:
        (q_prob,) = in_chunks(lambda a, b: (q_dist(a, b).gather(-1, committed[a:b]),), n, vocab)
        keys["q_prob"] = fetch.add(q_prob)
    if k is not None:

        def log_values(a: int, b: int) -> tuple[torch.Tensor, ...]:
            lsm = torch.log_softmax(logits[a:b], dim=-1, dtype=torch.float32)
            at = lsm.gather(-1, committed[a:b])
            if not k:
                return (at,)
            top = torch.topk(lsm, k, dim=-1)
            return at, top.indices, top.values

        values = in_chunks(log_values, n, vocab)
        keys["logprob"] = fetch.add(values[0])
        if k:
            keys["top_ids"], keys["top_lp"] = fetch.add(values[1]), fetch.add(values[2])
        keys["_k"] = k


def verify_probabilistic(q: VerifyQuery, dev: DeviceOps, fetch: Fetch) -> dict[str, int]:
    """The speculative-sampling rule for one row: accept x_i while u_i < min(1, (q_i/p_i)^g); at the
    first rejection draw from normalize(max(q - p, 0)). Draws come from the row's own generator."""
    req = q.req
    c = req.config
    n = len(q.drafts)
    q_logits = adjusted(dev, q, q.q_rows)
    masked = q_logits.clone()
    masked[:, req.info.mask_token_id] = float("-inf")
    probs = F.probs_from_logits(masked, *transforms(c))
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

    _register_q_values([q], q_logits, lambda a, b: probs[a:b], committed, keys, fetch)
    return keys


def read_verifications(checks: list[tuple[VerifyQuery, dict[str, int]]], fetch: Fetch) -> None:
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


def _read_device_checks(group: list[VerifyQuery], keys: dict[str, int], fetch: Fetch) -> None:
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

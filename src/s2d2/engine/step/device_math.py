"""The device half of a decode step: everything computed from a forward's logits, batched over rows.

After each forward the host half (:mod:`.host`) describes what every row needs from its logits as
queries (:class:`DraftQuery` for drafting or editing slots, :class:`VerifyQuery` for an AR-mode check of
a drafted span); :func:`run_queries` computes them all as batched tensor operations on the model's
device (rows with the same sampling transforms share one softmax; draws use each request's own
generator, so a row's values never depend on its batch-mates) and brings the small results back in ONE
transfer (:meth:`~.device.DeviceOps.to_host`). Logits never leave the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ...decoding.logits_readers import WHOLE_ROWS, Reader
from .device import DeviceOps, Fetch
from .draft_math import DraftQuery, by_transforms, draft_group, read_group
from .verify_math import VerifyQuery, read_verifications, verify_probabilistic, verify_strict


class BatchedCheck(Protocol):
    """Device values a lane registers for many rows at once (:mod:`.lanes`), read back from the
    step's one transfer. It asks for no raw logits (``in_place``: see :func:`run_queries`)."""

    def register(self, dev: DeviceOps, fetch: Fetch, in_place: bool) -> None: ...

    def read(self, fetch: Fetch) -> None: ...


@torch.inference_mode()
def run_queries(
    dev: DeviceOps,
    edits: Sequence[DraftQuery],
    drafts: Sequence[DraftQuery],
    verifies: Sequence[VerifyQuery],
    batched: Sequence[BatchedCheck] = (),
    reader: Reader = WHOLE_ROWS,
) -> None:
    """Compute every query on the device, then fill their results from ONE transfer (see the module).

    Edits are drawn before drafts, so a row that edits and drafts in one step draws in that order. Where
    no query asks for log-probabilities, the forward's logits are masked in place (no copy where the rows
    tile them; the forward's logits are read by this step's queries alone). ``batched``: lanes' checks,
    registered after the queries. ``reader``: how the queries' rows are read (whole rows, or the rows'
    summaries where every row's traits allow them)."""
    fetch = Fetch()
    pending, checks, in_place = [], [], True
    if edits or drafts or verifies:  # (a step of lane rows alone registers the lanes' checks only)
        pending, checks, in_place = _register_queries(dev, fetch, edits, drafts, verifies, reader)
    for b in batched:
        b.register(dev, fetch, in_place)
    if not fetch.parts:
        return
    fetch.values = dev.to_host(fetch.parts)
    for group in pending:
        read_group(group, fetch)
    read_verifications(checks, fetch)
    for b in batched:
        b.read(fetch)


def _register_queries(
    dev: DeviceOps,
    fetch: Fetch,
    edits: Sequence[DraftQuery],
    drafts: Sequence[DraftQuery],
    verifies: Sequence[VerifyQuery],
    reader: Reader,
) -> tuple[list, list, bool]:
    """Register the queries' device work with ``fetch``: the draft groups and the verifications to read
    back, and whether the forward's logits may be masked in place (no query asks for log-probabilities)."""
    batches = (edits, drafts, verifies)
    _upload_grammar(dev, batches)
    in_place = not any(q.req.config.logprobs is not None for batch in batches for q in batch)
    pending = [
        draft_group(g, dev, fetch, in_place, reader)
        for batch in (edits, drafts)
        for g in by_transforms(batch)
    ]
    strict = [q for q in verifies if q.strict]
    checks = []
    if strict:
        checks = list(zip(strict, verify_strict(strict, dev, fetch, in_place, reader), strict=True))
    checks += [(q, verify_probabilistic(q, dev, fetch)) for q in verifies if not q.strict]
    return pending, checks, in_place


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


__all__ = ["BatchedCheck", "DraftQuery", "VerifyQuery", "run_queries"]

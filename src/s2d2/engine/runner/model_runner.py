"""Turns the running rows into one batched model call.

Each row contributes the segment of the forward it needs (``req.action``): a chunk of its prompt, its
draft block (with the previous block's committed tokens folded in front), or its 2L verification. All
segments run as ONE forward: the runner describes it as one host-side batch (:meth:`ModelRunner.forward`),
the adapter returns packed logits, and the runner hands each row its own logits back and counts what the
forward cost. Building a row's part writes nothing to the row
(:class:`~.row_forward.RowForward` carries what the step applies after the forward), and the forward
advances no length and takes no page: the step and the scheduler do (docs/ARCHITECTURE.md, "Who writes
what").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...cost.step_cost import StepShape
from ...families.base import ModelAdapter
from ...forward.attention_groups import split_by_length
from ...forward.describe import describe, per_row
from ...forward.segment import Segment
from ...forward.vocab_summary import WIDTH, Summarized
from ...layouts import family, specs
from ...layouts.layout import last_rows
from ..draft_step import VerifyMode
from ..request import Action, Request
from ..request_limits import prefill_positions
from ..row_forward import RowForward
from ..step import predraft_inputs, steady

#: the steady AR draft's logit row (:func:`~.step.lanes.steady`): the mask's, the last of two
_LAST_ROW = last_rows(2, 1)


@dataclass
class ForwardCounters:
    """Engine-wide counts: forwards, rows per forward and query tokens fed to the model."""

    forwards: int = 0
    rows: int = 0
    query_tokens: int = 0

    @property
    def mean_rows(self) -> float:
        return self.rows / self.forwards if self.forwards else 0.0


class ModelRunner:
    """Builds each row's segment and runs the batch (see the module docstring)."""

    def __init__(self, adapter: ModelAdapter, *, prefill_chunk: int = 512):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.adapter = adapter
        self.prefill_chunk = prefill_chunk
        self.counters = ForwardCounters()
        #: the step's forwards give rows' summaries where the adapter can (tensor-parallel ranks: no
        #: full-vocabulary gather; :class:`~s2d2.forward.vocab_summary.Summarized`); off: always logits
        self.summaries = True

    @staticmethod
    def shape(segments: Sequence[Segment]) -> StepShape:
        """The shape of a forward over ``segments`` (before it runs: cached lengths advance in it)."""
        lengths = [s.state.length for s in segments]
        return StepShape.of([s.n for s in segments], lengths, split_by_length(segments))

    def layout(self, req: Request) -> RowForward:
        """``req``'s part of the next forward (host tensors; the adapter moves them to its device), laid
        out by :mod:`s2d2.layouts.family` from the model's traits (``adapter.info``) and bound to the row's
        cache state. Reads the row and writes nothing to it."""
        cache, action, info = req.cache, req.action, self.adapter.info
        if req.traits.lane == "ar" and steady(req):  # the AR lane's common draft, written out
            st, start, mask_id = cache.state, req.cursor.start, info.mask_token_id
            spec = specs.draft(1, (False,), 1, req.config.causal_cache, 0)  # made once (memoised)
            seg = Segment(st, [req.tokens[start - 1], mask_id], [start - 1, start], spec, 1, _LAST_ROW)
            return RowForward(seg, steady=True)
        if cache.restore_to is not None and cache.recompute_left > 0:
            return RowForward(self.recompute_segment(req))
        if action is Action.DRAFT or action is Action.POST or action is Action.LEAD:
            cfg, cur, st = req.config, req.cursor, cache.state
            # empty once a causal cache holds the block's start
            pending = req.tokens[st.length : cur.start] if st.length < cur.start else []
            c, ext = cache.block_cached, cache.partial
            if action is Action.LEAD:
                lead = cur.candidates[0]
                lay = family.lead(info, st.length, pending, cur.ids, start=cur.start, cached=c, extend=ext)
            else:
                lead = req.draft_lead() if req.ar_lead else None
                lay = family.draft(
                    info, st.length, pending, cur.ids, start=cur.start, block_size=cfg.block_size,
                    causal=cfg.causal_cache, cached=c, extend=ext, lead=lead,
                )  # fmt: skip
            seg = Segment.of(st, lay)
            return RowForward(seg, lead, seg.keep - len(pending))
        if action is Action.PREFILL:
            cfg, st = req.config, cache.state
            B = cfg.block_size
            chunk = prefill_positions(self.prefill_chunk, B)
            ids = torch.tensor(req.tokens[st.length : min(cache.prompt_blocks, st.length + chunk)])
            lay = family.prefill(info, st.length, ids, block_size=B, causal=cfg.causal_cache)
            return RowForward(Segment.of(st, lay))
        return RowForward(self._verify_segment(req))

    def _verify_segment(self, req: Request) -> Segment:
        cur, cache, info = req.cursor, req.cache, self.adapter.info
        st = cache.state
        if req.action == Action.VERIFY:
            p, c = req.pending, cache.block_cached
            filled = p.filled  # token ids (a list; the layouts take lists or host tensors)
            if p.mode == VerifyMode.FUSED:
                groups = predraft_inputs(req, p.groups)
                lay = family.fused(
                    info, st.length, filled, start=cur.start, slots=p.span_slots, predrafts=groups, cached=c
                )
            else:
                lay = family.verify(info, st.length, filled, start=cur.start, slots=p.span_slots, cached=c)
            return Segment.of(st, lay)
        raise RuntimeError(f"request {req.request_id!r} needs no forward")

    def recompute_segment(self, req: Request) -> Segment:
        """The next chunk of a preempted row's cache, rewritten as it was first computed: prompt blocks
        as a prefill (in the same whole-block chunks from position 0), committed output as a commit."""
        st, cfg, cache = req.state, req.config, req.cache
        B = cfg.block_size
        end = min(cache.restore_to, st.length + prefill_positions(self.prefill_chunk, B))
        make = family.commit
        if st.length < cache.prompt_blocks:
            end, make = min(end, cache.prompt_blocks), family.prefill
        ids = torch.tensor(req.cached_tokens(end)[st.length :], dtype=torch.long)
        return Segment.of(st, make(self.adapter.info, st.length, ids, block_size=B, causal=cfg.causal_cache))

    def run(self, rows: Sequence[Request], segments: Sequence[Segment]) -> list[torch.Tensor]:
        """One forward over ``segments`` (one per row of ``rows``); each row's logits, in order, without
        its segment's zero rows (:meth:`forward` with ``zero_rows=False``: the step reads block slot ``i``
        at raw row ``i - segment.zero_rows``). Counts the forward and the query tokens fed (the engine's
        counters); touches no row."""
        summary = self.summaries and all(r.traits.summaries for r in rows)  # decided at admission
        logits = self.forward(segments, False, summary=summary)
        c = self.counters
        c.forwards += 1
        c.rows += len(rows)
        c.query_tokens += sum(s.n for s in segments)
        return logits

    def forward(
        self, segments: Sequence[Segment], zero_rows: bool = True, *, summary: bool = False
    ) -> list[torch.Tensor]:
        """The step's forward: the runner describes it as ONE host-side batch (:func:`~s2d2.forward.
        describe.describe`: packed ids and positions, page tables, each query's visibility as integers,
        the logit rows), the adapter runs that batch and returns packed logits ``[L, vocab]``, and the
        runner splits them into each segment's rows (:func:`~s2d2.forward.describe.per_row`). Segments
        no batch describes (a float bias, transformers' own forward) run through ``adapter.run``, as do
        all those of an object that only follows the protocol (not a :class:`ModelAdapter`: a wrapper
        of one, which sees every forward as ``run``). Without ``zero_rows`` each row comes back without
        its segment's :attr:`~s2d2.forward.segment.Segment.zero_rows` (a partly cached block's draft:
        its raw rows, views of the forward's output, no copy a row). With ``summary``, where the adapter
        :attr:`~s2d2.families.base.ModelAdapter.summarizes` and no segment re-aligns its rows, each row
        gets its summaries ``[n, WIDTH]`` instead (a :class:`~s2d2.forward.vocab_summary.Summarized`)."""
        ad = self.adapter
        live = [s for s in segments if s.n]
        pool = live[0].state.cache if live else None
        geometry = ad.geometry(pool) if live and isinstance(ad, ModelAdapter) else None
        batch = describe(live, pool, geometry) if geometry is not None else None
        if batch is None:
            out = ad.run(segments)
            if zero_rows:
                return out
            return [lg[s.zero_rows :] if s.zero_rows else lg for s, lg in zip(segments, out, strict=True)]
        sizes, vocab = batch.logit_sizes, ad.info.vocab_size
        if summary and ad.summarizes and sum(sizes) and all(s.finish is None for s in live):
            got = ad.forward(pool, batch, ad.info.mask_token_id).split(sizes)

            def full() -> list[torch.Tensor]:
                return per_row(segments, ad.full_logits().split(sizes), vocab, ad.device, zero_rows)

            return Summarized(per_row(segments, got, WIDTH, ad.device, zero_rows), full)
        return per_row(segments, ad.forward(pool, batch).split(sizes), vocab, ad.device, zero_rows)

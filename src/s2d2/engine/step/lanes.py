"""The lanes: the common AR and lossless steps of many rows at once, in batched queries.

A row's lane is decided at admission (its traits' ``lane``, :class:`~..request.RowTraits`):

- the AR lane: block size 1 with plain greedy settings (no policy, logit adjustments, grammar,
  log-probabilities, trace, editing or AR lead). Its step drafts the one masked slot and commits it;
  every lane row's token is ONE registration (:class:`~.lane_math.GreedyTokens`). Most of its steps are
  :func:`steady` (layout ``[token, mask]``);
- the lossless lane: plain greedy S2D2 whose policy always verifies, with strict acceptance and no
  fusion, planner, adjustments, grammar, log-probabilities, trace or editing. Its steps alternate a draft
  forward and a verification forward: the drafting rows' drafts are one registration a part of rows
  (:class:`~.lane_math.GreedyDrafts`), the verifying rows' AR-mode argmax ONE
  (:class:`~.lane_math.StrictCheck`).

Their registrations ride the step's one transfer with every other query; each row's bookkeeping is then
the host's fast branch of :func:`~.host.apply` for it (:func:`~.host.apply_ar_draft`,
:func:`~.host.apply_plain_draft`, :func:`~.host.apply_plain_verify`). A lane row's step that is not the
lane's common one (a pre-draft, an AR lead, a planned verification) takes the general step; where the
step's batched queries fail, :meth:`Lanes.as_rows` hands the rows back to it.
"""

from __future__ import annotations

import torch

from ...decoding.logits_readers import WHOLE_ROWS, Reader
from ..draft_step import VerifyMode
from ..request import Action, Request
from ..row_forward import RowForward
from .device import DeviceOps
from .device_math import BatchedCheck
from .host import apply_ar_draft, apply_plain_draft, apply_plain_verify
from .lane_math import GreedyDrafts, GreedyTokens, StrictCheck
from .row_queries import Fail, RowWork, queries_alone

#: a taken row: the request, its part of the forward, its logits (the runner's raw rows)
Taken = tuple[Request, RowForward, torch.Tensor]


def steady(req: Request) -> bool:
    """Whether ``req``'s next forward is the AR lane's steady draft: an AR lane row drafting afresh (no
    AR lead or pre-drafts) whose open block is one masked slot past its prompt (step 0 of unit 0), with
    one committed token pending before it and nothing of the block cached, on a family that is not
    shifted: what :func:`~.host.apply_ar_draft` leaves a row whose next block it opens. Its layout is
    ``[token, mask]`` (:meth:`~..runner.model_runner.ModelRunner.layout`). Reads only."""
    cur, cache, info = req.cursor, req.cache, req.info
    mask_id = info.mask_token_id
    return (
        req.traits.lane == "ar"
        and req.action is Action.DRAFT
        and cur.length == 1
        and cur.ids[0] == mask_id
        and cache.block_cached == 0
        and cache.restore_to is None
        and cache.state.length + 1 == cur.start
        and cur.first_generated == 0
        and cur.step == 0
        and cur.unit_id == 0
        and not cur.in_post
        and not req.ar_lead
        and req.predraft is None
        and mask_id not in req.stop_set
        and not info.shifted
    )


class Lanes:
    """The lanes' rows of one step, in order: AR drafts, lossless drafts, lossless verifications."""

    def __init__(self, reader: Reader = WHOLE_ROWS) -> None:
        #: how the rows' logits are read (whole rows, or their summaries)
        self.reader = reader
        self.ar: list[Taken] = []
        self.drafting: list[Taken] = []
        self.verifying: list[Taken] = []
        #: the verifying rows' spans of drafts, concatenated in row order, and their lengths
        self.spans: list[int] = []
        self.sizes: list[int] = []
        self.tokens: GreedyTokens | None = None
        self.drafts: GreedyDrafts | None = None
        self.check: StrictCheck | None = None

    def take(self, req: Request, logits: torch.Tensor, forward: RowForward) -> bool:
        """Take ``req`` into its lane if this step of it is the lane's common one; a verifying row's span
        of drafts is read as it is taken."""
        lane, action = req.traits.lane, req.action
        if forward.steady or (
            lane == "ar" and action is Action.DRAFT and forward.lead is None and req.predraft is None
        ):
            self.ar.append((req, forward, logits))
            return True
        if lane != "lossless":
            return False
        if action is Action.DRAFT:
            if forward.lead is not None or req.predraft is not None:
                return False
            self.drafting.append((req, forward, logits))
            return True
        p = req.pending
        if action is not Action.VERIFY or p.mode is not VerifyMode.PLAIN or p.groups or p.plan is not None:
            return False
        off, n = p.span_offset, p.span_len
        self.spans += p.drafts.drafts[off : off + n]
        self.sizes.append(n)
        self.verifying.append((req, forward, logits))
        return True

    def checks(self, dev: DeviceOps) -> list[BatchedCheck]:
        """The lanes' batched device work, each only where the lane has such rows (:mod:`.lane_math`)."""
        reader = self.reader
        self.tokens = self.drafts = self.check = None
        if self.ar:
            self.tokens = GreedyTokens([t[0] for t in self.ar], [dev.mark(t[2]) for t in self.ar], reader)
        if self.drafting:
            rows = [(req, dev.mark(lg), f.segment.zero_rows) for req, f, lg in self.drafting]
            self.drafts = GreedyDrafts(dev, rows, reader)
        if self.verifying:
            mask_id = self.verifying[0][0].info.mask_token_id
            rows = [dev.mark(lg) for _, _, lg in self.verifying]
            self.check = StrictCheck(mask_id, rows, self.spans, self.sizes, reader)
        return [c for c in (self.tokens, self.drafts, self.check) if c is not None]

    def apply(self, fail: Fail) -> None:
        """Every lane row's step from its filled results (an error fails its row alone)."""
        if self.tokens is not None:
            for (req, fwd, _), tok in zip(self.ar, self.tokens.tokens, strict=True):
                try:
                    apply_ar_draft(req, fwd, tok)
                except Exception as exc:  # one request's failure must not stop its batch-mates
                    fail(req, exc)
        if self.drafts is not None:
            g = self.drafts
            for (req, fwd, _), drafts, conf in zip(self.drafting, g.drafts, g.conf, strict=True):
                try:
                    apply_plain_draft(req, fwd, drafts, conf)
                except Exception as exc:
                    fail(req, exc)
        if self.check is not None:
            ch = self.check
            for (req, fwd, _), n_acc, corr in zip(self.verifying, ch.n_accepted, ch.corrections, strict=True):
                try:
                    apply_plain_verify(req, fwd, n_acc, None if corr < 0 else corr)
                except Exception as exc:
                    fail(req, exc)

    def as_rows(self, dev: DeviceOps, fail: Fail) -> list[RowWork]:
        """The lanes' rows handed back to the general step (:func:`~.row_queries.queries_alone`), the
        lanes emptied: where the step's batched queries failed, each row's are run alone."""
        works = queries_alone(dev, self.ar + self.drafting + self.verifying, fail)
        self.ar, self.drafting, self.verifying, self.spans, self.sizes = [], [], [], [], []
        self.tokens = self.drafts = self.check = None
        return works

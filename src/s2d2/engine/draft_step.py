"""One decoding step of a row: what its drafter proposed and what the step has committed so far.

The values are host lists (they came back in the step's one device-to-host transfer); only ``probs``,
the drafter's distributions that a probabilistic verification needs, stays on the model's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from ..decoding.policies import RouteFeatures, SkipCheck


class VerifyMode(StrEnum):
    """How a step that verifies is checked by the AR mode."""

    #: one 2L verification forward of the span
    PLAIN = "plain"
    #: the verification forward also carries the next step's pre-draft groups (docs/METHOD.md section 8)
    FUSED = "fused"
    #: a 2L verification of only the span's first k positions (the planner's choice, ``plan=auto``)
    PREFIX_K = "prefix"
    #: the smallest forward: the AR-mode prediction at the first undecided position, one token committed
    AR_ONLY = "ar-only"


@dataclass
class Plan:
    """What the step planner (:mod:`.planner`) chose for one verifying row this step.

    ``k``: span positions verified (the span's first k); ``positions``: rejection groups of a fused
    verification; ``expected``: expected committed tokens (the survival sum of the acceptance estimates);
    ``tokens``: query tokens the row feeds; ``full_span``: the routed span's length before the choice;
    ``drafted``: False for an AR-only step that replaced a draft forward (its one "draft" is a
    placeholder, not counted as drafted)."""

    mode: VerifyMode
    k: int
    positions: int = 0
    expected: float = 0.0
    tokens: int = 0
    full_span: int = 0
    drafted: bool = True


@dataclass(slots=True)
class SlotDrafts:
    """The drafter's proposal at some block slots: per slot, the drafted token, its probability
    (confidence), entropy (nats), acceptance estimate, raw log-probability and top alternatives.

    Every list is aligned with ``slots``; optional values are None when nobody asked for them.
    """

    slots: list[int]
    drafts: list[int]
    conf: list[float]
    entropy: list[float] | None = None
    norm_entropy: list[float] | None = None
    alpha: list[float] | None = None
    logprob: list[float] | None = None
    top: list[tuple[tuple[int, float], ...]] | None = None
    #: the drafter's most likely tokens per slot (fused verification's correction branches)
    alternatives: list[list[int]] | None = None
    #: drafter distributions on the device (probabilistic acceptance and traces only): slot i's is row
    #: ``prob_rows[i]`` of ``probs`` (row i when ``prob_rows`` is None)
    probs: torch.Tensor | None = None
    prob_rows: list[int] | None = None

    def prob_rows_of(self, lo: int, hi: int) -> list[int]:
        """Rows of :attr:`probs` holding the distributions of slots ``lo .. hi - 1`` (list indices)."""
        return self.prob_rows[lo:hi] if self.prob_rows is not None else list(range(lo, hi))

    def pick(self, slots: list[int]) -> SlotDrafts:
        """The same values at ``slots`` (a subset of :attr:`slots`, in that order)."""
        where = {s: i for i, s in enumerate(self.slots)}
        idx = [where[s] for s in slots]

        def sub(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in idx]

        rows = None if self.probs is None else [self.prob_rows_of(i, i + 1)[0] for i in idx]
        return SlotDrafts(
            list(slots),
            sub(self.drafts),
            sub(self.conf),
            sub(self.entropy),
            sub(self.norm_entropy),
            sub(self.alpha),
            sub(self.logprob),
            sub(self.top),
            sub(self.alternatives),
            self.probs,
            rows,
        )


@dataclass(slots=True)
class DraftStep:
    """A step in progress: its candidates' drafts, which are committed, and the span to verify.

    Candidates are ``drafts.slots`` (block slots); ``done[i]`` says candidate i is committed; the span
    the AR mode checks is candidates ``[span_offset, span_offset + span_len)``.
    """

    drafts: SlotDrafts
    done: list[bool]
    quota: int
    n_committed: int = 0
    span_offset: int = 0
    span_len: int = 0
    features: RouteFeatures | None = None
    #: how the step is verified (None: it is not)
    mode: VerifyMode | None = None
    #: the verification forward's input: the block with every candidate filled by its draft
    filled: list[int] = field(default_factory=list)
    #: a verified step: what skipping would have committed, judged by this verification
    check: SkipCheck | None = None
    #: fused verification: the pre-draft groups its forward carries (:class:`~.fusion.GroupPlan`)
    groups: list[Any] = field(default_factory=list)
    #: the planner's choice for this step (``plan=auto`` rows it planned; None: as the settings say)
    plan: Plan | None = None

    @property
    def candidates(self) -> list[int]:
        return self.drafts.slots

    @property
    def span_slots(self) -> list[int]:
        return self.drafts.slots[self.span_offset : self.span_offset + self.span_len]

    @property
    def verified(self) -> bool:
        return self.mode is not None

"""The step planner's choice for a row about to draft: its draft forward, or AR only instead.

A row of the lossless family (``plan=auto``) whose next forward is a draft may instead commit one token
with the smallest forward: the AR-mode prediction at its first masked slot, read from a 2L
verification of that one slot (the block's committed tokens before it in the first half, token-causal;
one mask query in the second). The step is built here as a verification of a placeholder draft (the
mask token, never the argmax), so strict acceptance rejects it and commits the AR argmax: AR greedy's
token. Where committed tokens before the block's uncached part are not cached yet (a block's first
step after a block that ended on a correction), a verification cannot feed them: the step is then the
draft forward's AR lead alone (:func:`~s2d2.layouts.family.lead`), which feeds them
and the mask query, for adapters that carry leads.

The choice compares milliseconds per committed token at the step's marginal cost ``m`` per query token
and fixed share ``F / R`` per row: AR only ``m * tokens + F / R`` for one token (``tokens``:
:meth:`~.request.Request.lead_fed`); drafting
``m * (draft + verify tokens) + 2 F / R`` (a draft step, then its verification) for the tokens a
verification of its masked slots expects at the row's acceptance rate so far (accepted drafts over
accepted plus rejected ones; before :data:`PRIOR_DRAFTS` of them, the planned rows' rate together,
:func:`measured_acceptance`, :data:`PRIOR_ACCEPTANCE` before any),
plus the AR lead's token where the draft carries one (:func:`draft_value`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..draft_step import Plan, VerifyMode
from ..request import Action, Request
from .choice_matrices import MARGIN

#: Acceptance rate assumed for a row that has had fewer than :data:`PRIOR_DRAFTS` drafts verified.
PRIOR_ACCEPTANCE = 0.6
PRIOR_DRAFTS = 8
#: Rows about to draft that draft whatever the prices say while no acceptance is measured: were AR only
#: cheaper at the prior for every row, no draft would ever be verified and the prior never replaced.
EXPLORE_ROWS = 2


def eligible(req: Request) -> bool:
    """Whether ``req``'s draft forward may be replaced by an AR-only step (see the module docstring)."""
    cur, cache = req.cursor, req.cache
    return (
        req.action == Action.DRAFT
        and req.auto_plan
        and cache.partial
        and req.state is not None
        and bool(cur.candidates)
        and (req.ar_lead or not _pending(req))
    )


def _pending(req: Request) -> bool:
    """Whether committed tokens before the block's uncached part are not cached yet."""
    return req.commits_pending()


def _seen(req: Request) -> tuple[int, int]:
    """The row's verified drafts so far: (accepted, accepted + rejected)."""
    st = req.stats
    rejected = st.verify_steps - st.ar_only_steps - st.full_accepts
    return st.accepted, st.accepted + rejected


def measured_acceptance(rows: Sequence[Request]) -> float | None:
    """The acceptance rate of the planned rows' verified drafts together, or None before
    :data:`PRIOR_DRAFTS` of them in all."""
    accepted = seen = 0
    for r in rows:
        if r.auto_plan:
            a, s = _seen(r)
            accepted, seen = accepted + a, seen + s
    return accepted / seen if seen >= PRIOR_DRAFTS else None


def tokens_per_verify(req: Request, n: int, prior: float = PRIOR_ACCEPTANCE) -> float:
    """Committed tokens a verification of ``n`` fresh drafts expects at the row's acceptance rate so far
    (``a``: the chance a reached draft is accepted, accepted drafts over accepted plus rejected ones;
    ``prior`` before :data:`PRIOR_DRAFTS` of them; position j is reached with probability ``a ** j``)."""
    accepted, seen = _seen(req)
    a = accepted / seen if seen >= PRIOR_DRAFTS else prior
    return n if a >= 1.0 else (1.0 - a**n) / (1.0 - a)


def draft_value(req: Request, prior: float = PRIOR_ACCEPTANCE) -> tuple[float, int, int]:
    """What drafting now buys and costs beyond the draft forward: expected committed tokens, the query
    tokens of the verification that follows and the row-steps taken. A row whose draft carries the AR
    lead (:meth:`~.request.Request.draft_lead`) commits its first candidate with the draft; the
    verification checks the rest (none left: no verification step)."""
    n, lead = len(req.cursor.candidates), int(req.draft_lead() is not None)
    left = n - lead
    if left == 0:
        return 1.0, 0, 1
    return lead + tokens_per_verify(req, left, prior), 2 * left, 2


def prompt_tail(req: Request) -> int:
    """Prompt tokens the row's next forward carries, whether it drafts or takes AR only: a folded
    prompt's tail not cached yet before the block, and the block's own prompt slots before its first
    candidate that are not cached yet (both forwards feed the block up to that slot). They commit
    nothing whatever is chosen."""
    cur, n_prompt = req.cursor, req.n_prompt
    before = max(0, min(n_prompt, cur.start) - req.state.length)
    inside = max(0, min(n_prompt - cur.start, cur.candidates[0]) - req.cache.block_cached)
    return before + inside


def prefers_ar(
    req: Request, draft_tokens: int, m: float, share: float, prior: float = PRIOR_ACCEPTANCE
) -> bool:
    """Whether AR only is cheaper per committed token than drafting now (see the module docstring).
    The prompt tail both choices carry (:func:`prompt_tail`) is left out of both: counted, it would
    weigh on AR's one token as much as on a draft's several, and a row's first step after its prompt
    would always draft."""
    sunk = prompt_tail(req)
    ar = m * (req.lead_fed() - sunk) + share
    tokens, verify_tokens, steps = draft_value(req, prior)
    draft = m * (draft_tokens - sunk + verify_tokens) + steps * share
    return ar * tokens < draft * (1.0 - MARGIN)


def ar_only_plan(req: Request) -> Plan:
    """The plan of an AR-only step in place of ``req``'s draft (the step applies it:
    :func:`~..step.plans.to_ar_only`)."""
    return Plan(VerifyMode.AR_ONLY, 1, 0, 1.0, req.lead_fed(), 1, drafted=False)


def ar_only_value(req: Request) -> float:
    """What an AR-only step of ``req`` adds to the step's expected tokens as the planner counts a
    verifying row's: its one token where it verifies a placeholder draft, nothing as a lone lead."""
    return 0.0 if _pending(req) else 1.0

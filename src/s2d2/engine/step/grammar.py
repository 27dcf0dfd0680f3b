"""Structured output in the engine: a constrained row's grammar masks, and what it may commit.

A constrained request (``Request.grammar``, a :class:`~s2d2.constraints.matcher.GrammarState`) commits
its output left to right within the grammar:

- :func:`sync` feeds the matcher the committed generated tokens it has not seen (up to the first
  undecided position, the *frontier*);
- :func:`attach_masks` gives the row's queries their host bitmask rows: a draft (or AR lead) query the
  frontier's mask at its first slot when that slot is the frontier; a verification the mask at every span
  position, given the drafts before it (the matcher walks the drafts and rolls back). The device half
  masks the logits with them (:mod:`.device_math`), so strict acceptance commits the constrained AR
  argmax and a draft the grammar forbids is rejected like any mismatch;
- :func:`forced_commits` (``config.jump_forward``): before a row's next draft, the tokens the grammar
  forces at the open block's first masked slots are committed outright, without drafting or verifying
  them (AR mode too): each is the only token constrained AR could emit. A block is closed this way only
  while the committed tokens waiting to be cached stay within what a draft forward may feed
  (:func:`~..request_limits.draft_room`'s pending part);
  stop tokens, and rows that report log-probabilities or a trace, are left to the normal step;
- :func:`jump_forward` (``config.jump_forward``) sets the drafts of the consecutive slots from the
  frontier where the grammar allows exactly one token (keys of a schema, brackets, closing tags) to that
  token before they are verified: the only token constrained AR could emit there, so verification (strict
  or probabilistic: its masked probability is 1) accepts it and spans run further;
- :func:`conforming_picks` keeps what a baseline rule (or S2D2's fallback) commits without verification
  to the run of consecutive slots from the frontier that the grammar allows (the frontier's own draft
  at least, which was drawn under its mask), so every decoder's output conforms.
"""

from __future__ import annotations

from ...constraints.matcher import ConstraintViolation, GrammarState
from ..draft_step import DraftStep
from ..request import Action, Request
from .row_queries import RowWork


def _token_at(req: Request, pos: int) -> int:
    cur = req.cursor
    if pos < cur.start or cur.ids is None:
        return req.tokens[pos]
    return cur.ids[pos - cur.start] if pos < cur.start + cur.length else req.info.mask_token_id


def sync(req: Request) -> GrammarState:
    """Feed the matcher the committed generated tokens after the ones it has; returns the state."""
    g = req.grammar
    assert g is not None
    mask_id, new = req.info.mask_token_id, []
    pos = req.n_prompt + g.fed
    end = min(req.limit, req.cursor.start + (req.cursor.length if req.cursor.ids is not None else 0))
    while pos < end and not g.terminated:
        t = _token_at(req, pos)
        if t == mask_id:
            break
        new.append(t)
        pos += 1
    if new:
        g.advance(new)
    return g


def frontier_slot(req: Request) -> int:
    """The open block's slot of the first undecided generated position (after :func:`sync`)."""
    return req.n_prompt + req.grammar.fed - req.cursor.start


def unbound(req: Request, g: GrammarState) -> bool:
    """Whether nothing the row commits from here reaches the output, so the grammar holds nothing: it
    ended, or the output is whole (its frontier is at the request's limit; a preset that decodes the
    last block in full, ``last_block="full"``, fills slots after it that are cut off)."""
    return g.terminated or req.n_prompt + g.fed >= req.limit


def attach_masks(work: RowWork) -> None:
    """Give the row's draft, lead and verification queries their grammar bitmask rows (host tensors)."""
    req = work.req
    g = sync(req)
    if unbound(req, g):
        return  # the output ended with the grammar, or is whole: nothing after it is kept
    front = frontier_slot(req)
    if work.draft is not None and work.draft.slots and work.draft.slots[0] == front:
        work.draft.grammar_bits = g.masks((), 1)
    if work.lead is not None and work.forward.lead == front:
        work.lead.grammar_bits = g.masks((), 1)
    if work.action == Action.VERIFY and work.verify is not None:
        if req.pending.span_slots[0] != front:
            raise ConstraintViolation(
                f"a verified span starts at slot {req.pending.span_slots[0]}, not at the grammar's "
                f"frontier {front}"
            )
        drafts = work.verify.drafts
        work.verify.grammar_bits = g.masks(drafts, len(drafts))


def conforming_picks(req: Request, p: DraftStep, chosen: list[int]) -> list[int]:
    """Of the baseline rule's ``chosen`` candidate indices, the ones a constrained row may commit: the
    frontier's candidate (always), then the chosen candidates at the consecutive slots after it, cut at
    the first draft the grammar refuses."""
    g = sync(req)
    if unbound(req, g):
        return chosen  # after the stop token or the limit: nothing here reaches the output
    front = frontier_slot(req)
    v = p.drafts
    index = {s: i for i, s in enumerate(v.slots) if not p.done[i]}
    if front not in index:
        return []
    picked, run, s = set(chosen), [index[front]], front + 1
    while s in index and index[s] in picked:
        run.append(index[s])
        s += 1
    return run[: g.accepted_prefix([v.drafts[i] for i in run])]


def jump_forward(req: Request, p: DraftStep) -> int:
    """Fill the forced drafts of the run of consecutive slots from the frontier (see the module
    docstring; their confidence and acceptance estimate become 1); returns how many were forced."""
    g = sync(req)
    if unbound(req, g):
        return 0
    v, s = p.drafts, frontier_slot(req)
    index = {slot: i for i, slot in enumerate(v.slots) if not p.done[i]}
    run = []
    while s in index:
        run.append(index[s])
        s += 1
    filled, forced = g.forced_fill([v.drafts[i] for i in run])
    for i, tok, f in zip(run, filled, forced, strict=True):
        if f:  # certain: the planner and the router may count on it
            v.drafts[i], v.conf[i] = tok, 1.0
            if v.alpha is not None:
                v.alpha[i] = 1.0
    return sum(forced)


def forced_commits(req: Request, cand: list[int]) -> bool:
    """Commit the forced tokens at the open block's first candidates ``cand`` (masked slots, in order;
    see the module docstring); True when any was committed (the caller walks the block again)."""
    cfg, cur, st = req.config, req.cursor, req.cache.state
    if cfg.logprobs is not None or req.tracer.steps is not None or not cand:
        return False
    g = sync(req)
    if unbound(req, g) or cand[0] != frontier_slot(req):
        return False
    run = 1
    while run < len(cand) and cand[run] == cand[0] + run:
        run += 1
    room = max(cfg.block_size, req.cache.fold_limit)  # pending tokens a draft forward may feed
    if run == len(cand) and st is not None and cur.start + cur.length - st.length > room:
        run -= 1  # closing the block would leave the next forward more to cache than it may feed
    tokens = g.forced_tokens(run, frozenset(req.stop_set))
    for i, tok in enumerate(tokens):
        cur.ids[cand[i]] = tok
    return bool(tokens)

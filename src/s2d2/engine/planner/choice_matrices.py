"""The step planner's arithmetic: every planned row's choices as matrices, and the search over them.

For R planned rows the choices are columns of ``[R, C]`` matrices (``C = n_max + P + 1``): columns
``0 .. n_max - 1`` verify the span's first k = column + 1 positions (plain 2L layout), columns
``n_max + g`` a fused forward over the whole span with g rejection groups; a choice a row does not have
is marked in :attr:`Choices.valid`.

Every choice of a row commits, now or in its next verification, the same expected tokens
``E_n = sum_j r_j`` (``r_j``: the probability that span position j is reached, the product of the
acceptance estimates before it), so a row's choices differ in what they cost, in milliseconds of the
step's cost profile: this step's query tokens (``m`` ms each at the step's shape); for a prefix of
k < n positions, the later verification of the rest: two query tokens per position it reaches
(``2 (E_n - E_k)``) and, with probability ``r_k`` (all k accepted), a step's fixed share ``F / R``;
for a fused forward, its groups' host work, minus, with each group's hit probability, the draft step
the hit saves (``m`` x a draft's tokens plus ``F / R``, times :data:`HIT_WORTH`). The search picks,
per row, the cheapest choice, under each of a few caps on one row's query tokens (the padded attention
grows with the longest row), and keeps the picks of the best predicted ratio ``sum E / ms``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...cost.step_cost import StepCost
from ..draft_step import Plan, VerifyMode

#: Caps tried on the query tokens of one row (besides none), for batches of at least :data:`CAP_ROWS`.
CAPS = (8, 16)
CAP_ROWS = 8
#: Steps of at most this many rows have their totals summed in plain Python (:func:`point`).
SMALL_POINT = 8
#: Dinkelbach passes from each start.
PASSES = 1
#: How much better (predicted) than plain verification of every span and a draft for every drafting row
#: a choice must be to be taken: the profiles' errors on real steps are 5-20%, and a choice the profile
#: barely prefers is a coin toss that costs host work (pre-draft groups, more steps).
MARGIN = 0.1
#: A pre-draft hit's worth, as a share of the draft forward it saves: a group's drafts see the rejected
#: slot masked (or an assumed correction), so the step after a hit commits fewer tokens than one after a
#: fresh draft (lossless-fused B8 on tiny-gsm: 0.88 of steps hit, 3.9 tokens per verification against
#: 4.4 unfused).
HIT_WORTH = 0.7


@dataclass
class RowSpan:
    """What the planner reads of one verifying row (host values): acceptance estimates over its routed
    span, the span's first slot minus the cached slots (``off``), the slot of its first position, the
    block length, the next-block group's rows (0: none), the fused groups' most positions (-1:
    unfused), correction branches per position, its cached context and a draft forward's tokens."""

    alpha: Sequence[float]
    off: int
    span0: int
    length: int
    next_rows: int
    positions: int
    branches: int
    context: int
    draft_tokens: int


@dataclass
class Choices:
    """``[R, C]`` matrices: ``valid``; ``tokens`` (this step's query tokens); ``cont`` (probability of a
    later verification of the rest) and ``rest`` (its expected tokens); ``hit`` (probability that a group
    saves the next draft forward); ``groups``; ``expected`` (tokens committed this step). ``total``
    ``[R]``: E_n; ``draft`` ``[R]``: a draft forward's tokens."""

    valid: np.ndarray
    tokens: np.ndarray
    cont: np.ndarray
    rest: np.ndarray
    hit: np.ndarray
    groups: np.ndarray
    expected: np.ndarray
    total: np.ndarray
    draft: np.ndarray
    n_max: int


def build(rows: Sequence[RowSpan]) -> Choices:
    """The choice matrices of ``rows`` (see the module docstring), vectorised over rows."""
    R = len(rows)
    if not R:
        z, zi = np.zeros((0, 1)), np.zeros((0, 1), dtype=np.int64)
        return Choices(z.astype(bool), zi, z, z, z, zi, z, np.zeros(0), np.zeros(0, np.int64), 1)
    attrs = np.array(
        [(len(r.alpha), r.off, r.span0, r.length, r.next_rows, r.positions, r.branches, r.draft_tokens)
         for r in rows], dtype=np.int64,
    )  # fmt: skip
    n, off, span0, L, next_rows, positions, branches, draft = attrs.T
    n_max = int(n.max())
    P = int(positions.max())
    P = -1 if P < 0 else min(P, n_max)
    alpha = np.array([[*r.alpha, *[0.0] * (n_max - len(r.alpha))] for r in rows], dtype=float)
    np.clip(alpha, 0.0, 1.0, out=alpha)
    reach = np.ones((R, n_max + 1))
    np.cumprod(alpha, axis=1, out=reach[:, 1:])
    expected = np.cumsum(reach[:, :-1], axis=1)  # E_k at column k - 1
    k = np.arange(1, n_max + 1)[None, :]
    n_col = n[:, None]
    valid = k <= n_col
    off, span0, L, branches = off[:, None], span0[:, None], L[:, None], branches[:, None]
    rix = np.arange(R)
    total = expected[rix, n - 1]
    inside = k < n_col
    cont = np.where(inside, reach[:, 1:], 0.0)
    rest = np.where(inside, 2 * (total[:, None] - expected), 0.0)
    plain = (valid, off + 2 * k - 1, cont, rest, np.zeros((R, n_max)), np.zeros((R, n_max)))
    if P < 0:
        return Choices(*plain, np.where(valid, expected, 0.0), total, draft, n_max)
    j = np.arange(n_max)[None, :]
    first_reject = np.where((j < n_col) & (span0 + j != L - 1), reach[:, :-1] - reach[:, 1:], -1.0)
    order = np.argsort(-first_reject, axis=1, kind="stable")[:, :P]
    fr = np.take_along_axis(first_reject, order, axis=1)
    ok = fr >= 0
    zero = np.zeros((R, 1))
    g_rows = np.hstack([zero, np.cumsum(np.where(ok, branches * (L - span0 - order), 0), axis=1)])
    hit = np.where(next_rows > 0, reach[rix, n], 0.0)[:, None] + np.hstack(
        [zero, np.cumsum(np.where(ok, fr, 0.0), axis=1)]
    )
    g = np.arange(P + 1)[None, :]
    f_valid = (positions[:, None] >= 0) & (g <= positions[:, None]) & np.hstack([np.ones((R, 1), bool), ok])
    f_tokens = (off[:, 0] + 2 * n + next_rows)[:, None] + g_rows
    f_groups = (next_rows > 0)[:, None] + g * branches
    fz = np.zeros((R, P + 1))
    return Choices(
        np.hstack([valid, f_valid]),
        np.hstack([plain[1], f_tokens]).astype(np.int64),
        np.hstack([cont, fz]),
        np.hstack([plain[3], fz]),
        np.hstack([plain[4], hit]),
        np.hstack([plain[5], f_groups]),
        np.hstack([np.where(valid, expected, 0.0), np.repeat(total[:, None], P + 1, axis=1)]),
        total,
        draft,
        n_max,
    )


@dataclass
class Fixed:
    """The step's rows the planner does not choose for: their query tokens, contexts and expected
    committed tokens; ``sunk``: the query tokens among them that commit nothing this step whatever is
    chosen (prompt chunks)."""

    tokens: np.ndarray
    contexts: np.ndarray
    value: float
    sunk: int = 0


def predict(cost: StepCost, tokens: np.ndarray, contexts: np.ndarray) -> float:
    """Predicted ms of a step whose rows feed ``tokens`` after ``contexts`` (one attention group)."""
    return point(cost, tokens, contexts)[0]


def marginal(cost: StepCost, tokens: np.ndarray, contexts: np.ndarray) -> tuple[float, float]:
    """At a step of this shape: the marginal ms of one more query token (a secant over two more per
    row) and the fixed ms per row (what the step costs beyond its tokens, shared by its rows)."""
    _, m, share = point(cost, tokens, contexts)
    return m, share


def point(cost: StepCost, tokens: np.ndarray, contexts: np.ndarray) -> tuple[float, float, float]:
    """The predicted ms of a step whose rows feed ``tokens`` ``[rows]`` after ``contexts`` ``[rows]``,
    and the profile linearised there: ``(ms, m, share)``, ``m`` the marginal ms of a query token (the
    secant over two more a row), ``share`` a row's part of the rest. The shape's totals are taken once;
    those of two more tokens a row follow from them exactly (integer sums)."""
    n = int(tokens.size)
    if n == 0:
        return 0.0, 0.0, 0.0
    if n <= SMALL_POINT:  # the same integer totals in plain Python (numpy's per-call cost would dominate)
        toks = tokens.tolist()
        keys_list = [t + c for t, c in zip(toks, contexts.tolist(), strict=True)]
        T, K, A = sum(toks), sum(keys_list), sum(t * k for t, k in zip(toks, keys_list, strict=True))
        t_max, k_max = max(toks), max(keys_list)
    else:
        keys = tokens + contexts
        T, K, A = int(tokens.sum()), int(keys.sum()), int((tokens * keys).sum())
        t_max, k_max = int(tokens.max()), int(keys.max())
    ms = cost.predict_totals(n, T, float(A), K, float(n * t_max * k_max))
    wider = (n, T + 2 * n, float(A + 2 * T + 2 * K + 4 * n), K + 2 * n, float(n * (t_max + 2) * (k_max + 2)))
    m = max(cost.predict_totals(*wider) - ms, 0.0) / (2 * n)
    return ms, m, max(ms - m * T, 0.0) / n


@dataclass
class Drafting:
    """Rows about to draft, each with two choices (column 0: draft, 1: AR only, :mod:`.draft_or_ar`):
    ``value`` ``[D, 2]`` tokens (a draft's: what its verification expects), ``now`` this step's query
    tokens, ``later`` the later verification's tokens and ``steps`` the row-steps it takes (a draft and
    its verification: 2; AR only: 1); ``contexts`` ``[D]``; ``sunk``: the prompt tokens their forwards
    carry in either choice (a folded prompt's tail), which commit nothing."""

    value: np.ndarray
    now: np.ndarray
    later: np.ndarray
    steps: np.ndarray
    contexts: np.ndarray
    sunk: int = 0


def search(
    cost: StepCost,
    ch: Choices,
    contexts: np.ndarray,
    fixed: Fixed,
    start: np.ndarray,
    host: float,
    drafting: Drafting | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """The picks (a column per planned row, and per drafting row) and their predicted ms.

    Dinkelbach passes from three starts (the settings' choices; plain verification of every span; AR
    only everywhere): each pass linearises the cost profile at the current picks' shape (the marginal ms
    of a query token and a row's fixed share), takes each row's best choice at the current ratio of
    expected tokens to effective ms (this step's predicted ms plus the rows' later costs, see the module
    docstring, less the marginal ms of the prompt tokens it carries: they commit nothing whatever is
    chosen, and counting them would lower the ratio a choice has to beat, so that a step carrying
    prompts would take drafts that cost more per token than the engine's rate), and is kept if its
    exact ratio is better; the best picks then try caps on one row's query tokens (the padded
    attention grows with the longest row). ``host``: ms per pre-draft group."""
    R = ch.valid.shape[0]
    rix = np.arange(R)
    d = drafting if drafting is not None else _no_drafting()
    dix = np.arange(d.value.shape[0])
    all_ctx = np.concatenate([contexts, d.contexts, fixed.contexts])
    base_value = float(ch.total.sum()) + fixed.value
    later = _Later.of(ch, d, host)

    def tokens(picks: np.ndarray, dpicks: np.ndarray) -> np.ndarray:
        return np.concatenate([ch.tokens[rix, picks], d.now[dix, dpicks], fixed.tokens])

    def ratio_of(picks: np.ndarray, dpicks: np.ndarray, ms: float, m: float, share: float) -> float:
        """Expected tokens over effective ms: this step's plus the rows' later costs (at m, share)."""
        per_m, per_share, fixed_ms = later.rows[rix, picks].sum(axis=0)
        d_m, d_share, d_value = later.drafting[dix, dpicks].sum(axis=0)
        eff = ms - m * (fixed.sunk + d.sunk) + m * (per_m + d_m) + share * (per_share + d_share) + fixed_ms
        return (base_value + float(d_value)) / max(float(eff), 1e-9)

    smallest = later.smallest
    plain = np.argmax(np.where(ch.valid[:, : ch.n_max], np.arange(ch.n_max), -1), axis=1)
    D = dix.size
    draft, ar = np.zeros(D, int), np.ones(D, int)
    starts = [(plain, draft), (start, draft), (smallest, ar)]
    if np.array_equal(start, plain):
        starts.pop(1)
    found = []  # (ratio, ms, picks, dpicks, m, share)
    for picks, dpicks in starts:
        ms, m, share = point(cost, tokens(picks, dpicks), all_ctx)
        ratio = ratio_of(picks, dpicks, ms, m, share)
        found.append((ratio, ms, picks, dpicks, m, share))
        for _ in range(PASSES):
            picks, dpicks = later.repick(m, share, ratio, None)
            ms = predict(cost, tokens(picks, dpicks), all_ctx)
            ratio = ratio_of(picks, dpicks, ms, m, share)
            found.append((ratio, ms, picks, dpicks, m, share))
    plain_ratio, plain_ms = found[0][0], found[0][1]
    best = max(found, key=lambda f: f[0])
    if best[0] < plain_ratio * (1.0 + MARGIN):
        return plain, draft, plain_ms
    ratio0, _, _, _, m, share = best
    floor = int(fixed.tokens.max()) if fixed.tokens.size else 0
    for cap in [c for c in CAPS if c > floor] if R + D + fixed.tokens.size >= CAP_ROWS else []:
        picks, dpicks = later.repick(m, share, ratio0, cap)
        ms = predict(cost, tokens(picks, dpicks), all_ctx)
        ratio = ratio_of(picks, dpicks, ms, m, share)
        if ratio > best[0]:
            best = (ratio, ms, picks, dpicks, m, share)
    return best[2], best[3], best[1]


@dataclass
class _Later:
    """What each choice costs beyond this step's query tokens, linear in the step's marginal ms ``m``
    and fixed share ``share``, computed once a search: ``rows`` ``[R, C, 3]`` (ms per ``m``, per
    ``share``, and fixed ms) of every planned row's choices (the later verification of the rest, a
    fused group's host work, minus what a hit saves); ``drafting`` ``[D, 2, 3]`` (per ``m``, per
    ``share``, tokens valued) of every drafting row's; and the repick's matrices."""

    rows: np.ndarray
    drafting: np.ndarray
    cost_per_m: np.ndarray
    cost_per_share: np.ndarray
    cost_fixed: np.ndarray
    tokens: np.ndarray
    smallest: np.ndarray
    d_per_m: np.ndarray
    d_steps: np.ndarray
    d_value: np.ndarray

    @classmethod
    def of(cls, ch: Choices, d: Drafting, host: float) -> _Later:
        per_m = ch.rest - HIT_WORTH * ch.hit * ch.draft[:, None]
        per_share = ch.cont - HIT_WORTH * ch.hit
        fixed_ms = host * ch.groups
        rows = np.stack([per_m, per_share, fixed_ms], axis=2)
        drafting = np.stack([d.later, d.steps - 1, d.value], axis=2).astype(float)
        invalid = np.where(ch.valid, 0.0, np.inf)
        smallest = np.argmin(np.where(ch.valid, ch.tokens, 1 << 30), axis=1)
        return cls(rows, drafting, ch.tokens + per_m, per_share, fixed_ms + invalid, ch.tokens, smallest,
                   d.now + d.later, d.steps, d.value)  # fmt: skip

    def repick(self, m: float, share: float, ratio: float, cap: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Each row's best choice at marginal ``m``, fixed share ``share`` and price ``ratio`` (tokens
        per ms), with at most ``cap`` query tokens a row (its smallest choice always allowed); planned
        rows' choices differ in cost only, drafting rows' in value and cost."""
        cost_ms = m * self.cost_per_m + share * self.cost_per_share + self.cost_fixed
        if cap is not None:
            allowed = self.tokens <= cap
            allowed[np.arange(allowed.shape[0]), self.smallest] = True
            cost_ms = np.where(allowed, cost_ms, np.inf)
        if self.d_value.size:
            dpicks = np.argmax(self.d_value - ratio * (m * self.d_per_m + self.d_steps * share), axis=1)
        else:
            dpicks = np.zeros(0, int)
        return np.argmin(cost_ms, axis=1), dpicks


def _no_drafting() -> Drafting:
    z = np.zeros((0, 2))
    return Drafting(z, z.astype(np.int64), z.astype(np.int64), z.astype(np.int64), np.zeros(0, np.int64))


def row_costs(r: RowSpan, m: float, share: float, host: float) -> list[tuple[float, int, int, float]]:
    """One row's choices without numpy (small batches): ``(cost ms, column, tokens, expected now)``
    per valid choice, the costs :func:`search` computes (column: k - 1 for a prefix of k, ``n + g`` for
    fused with g groups)."""
    n = len(r.alpha)
    reach = [1.0]
    for a in r.alpha:
        reach.append(reach[-1] * min(1.0, max(0.0, a)))
    total = sum(reach[:n])
    out, e = [], 0.0
    for k in range(1, n + 1):
        e += reach[k - 1]
        tokens = r.off + 2 * k - 1
        later = m * 2 * (total - e) + reach[k] * share if k < n else 0.0
        out.append((m * tokens + later, k - 1, tokens, e))
    if r.positions < 0:
        return out
    L = r.length
    first = sorted(
        (j for j in range(n) if r.span0 + j != L - 1), key=lambda j: -(reach[j] - reach[j + 1])
    )
    saved = HIT_WORTH * (m * r.draft_tokens + share)
    hit = reach[n] if r.next_rows else 0.0
    rows, groups = r.next_rows, int(r.next_rows > 0)
    for g in range(min(r.positions, n, len(first)) + 1):
        if g:
            j = first[g - 1]
            hit += reach[j] - reach[j + 1]
            rows += r.branches * (L - r.span0 - j)
            groups += r.branches
        tokens = r.off + 2 * n + rows
        out.append((m * tokens + host * groups - hit * saved, n + g, tokens, e))
    return out


def plan_of(ch: Choices, row: int, col: int, full_span: int) -> Plan:
    """The :class:`Plan` of column ``col`` of planned row ``row`` of the matrices."""
    tokens, expected = int(ch.tokens[row, col]), float(ch.expected[row, col])
    return column_plan(full_span + col - ch.n_max if col >= ch.n_max else col, full_span, tokens, expected)


def column_plan(col: int, n: int, tokens: int, expected: float) -> Plan:
    """Column ``col`` of a row of span ``n`` (k - 1 for a prefix of k; ``n + g``: fused, g groups)."""
    if col >= n:
        return Plan(VerifyMode.FUSED, n, col - n, expected, tokens, n)
    k = col + 1
    mode = VerifyMode.PLAIN if k == n else VerifyMode.AR_ONLY if k == 1 else VerifyMode.PREFIX_K
    return Plan(mode, k, 0, expected, tokens, n)

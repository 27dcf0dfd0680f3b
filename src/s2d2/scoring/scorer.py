"""Exact AR-mode log-likelihoods: how likely a model finds given continuations of given contexts.

Every block-diffusion model here is also an autoregressive model at block size 1, and :class:`Scorer`
reads that model: token i of a continuation is scored by the distribution the AR mode has at position i
given every token before it (same-position models: a MASK query at i behind the tokens < i, the first
half of the 2L verification; shifted models: a plain causal forward). Values are ``log_softmax`` of the
raw float32 logits over the whole vocabulary, no sampling transform.

Requests are batched on the adapter's packed forward (:meth:`~s2d2.families.base.ModelAdapter.run`):

* one row per job, many rows per forward (up to ``max_rows`` rows and ``batch_tokens`` tokens), as many
  rows at a time as ``kv_tokens`` positions hold (rows x the longest job so far; the pool may round
  both up to its next doubling);
* requests with the same context form one job: the context is fed once and the continuations are its
  branches in the same forward (lm-eval's multiple-choice requests);
* a long job is fed in pieces of at most ``chunk_tokens`` tokens, its context kept in the row's cache.

Rows live in a key/value pool of the scorer's own (made per call, from ``adapter.new_pool()``), so scoring
never touches the decoding engine's rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError, PromptError
from ..families.base import ModelAdapter
from ..forward.kv_pool import KVState
from ..forward.segment import Segment
from ..layouts import family


@dataclass
class TokenScores:
    """The scores of one continuation: per token its log-probability, whether it is the argmax and
    (when asked for) the ``top`` most likely ``(token_id, logprob)`` of its position, most likely first."""

    logprobs: list[float]
    greedy: list[bool]
    top: list[list[tuple[int, float]]] | None = None

    @property
    def total(self) -> float:
        """The continuation's log-likelihood: the sum of its tokens' log-probabilities."""
        return float(sum(self.logprobs))


@dataclass
class _Piece:
    """One forward of a job: ``prefix`` kept in the cache (its tokens from ``score_from`` scored) and
    ``branches`` (the job's continuations, all scored), as :func:`s2d2.layouts.family.score` takes them."""

    prefix: torch.Tensor
    score_from: int
    branches: list[torch.Tensor]

    @property
    def cost(self) -> int:
        """Query tokens of the piece, as a same-position model feeds them (an upper bound when shifted)."""
        return 2 * self.prefix.numel() - self.score_from + sum(2 * b.numel() - 1 for b in self.branches)


@dataclass
class _Job:
    """A row's work: its pieces in order and the requests its scored tokens belong to, in order."""

    pieces: deque[_Piece]
    targets: list[tuple[int, torch.Tensor]]
    state: KVState | None = None
    #: per forward: the scored tokens' (logprobs [k], greedy [k], top ids [k, t], top logprobs [k, t])
    parts: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    scored: int = 0

    def __post_init__(self) -> None:
        #: most positions the job's row writes: its kept prefixes and its largest forward
        self.span = sum(p.prefix.numel() for p in self.pieces) + max(p.cost for p in self.pieces)

    def split(self) -> list[tuple[int, tuple[torch.Tensor, ...]]]:
        """Each target request with its share of the scored rows."""
        joined = [torch.cat(column) for column in zip(*self.parts, strict=True)]
        sizes = [t.numel() for _, t in self.targets]
        return [
            (i, tuple(c[at : at + k] for c in joined))
            for (i, _), at, k in zip(self.targets, _offsets(sizes), sizes, strict=True)
        ]


class Scorer:
    """Scores ``(context, continuation)`` token-id pairs with an adapter (see the module docstring)."""

    def __init__(
        self,
        adapter: ModelAdapter,
        *,
        chunk_tokens: int = 512,
        batch_tokens: int = 4096,
        max_rows: int = 64,
        kv_tokens: int = 65536,
    ):
        if chunk_tokens < 2 or batch_tokens < chunk_tokens or max_rows < 1 or kv_tokens < 1:
            raise ConfigError(
                "scorer limits: chunk_tokens >= 2, batch_tokens >= chunk_tokens, max_rows, kv_tokens >= 1"
            )
        self.adapter = adapter
        self.chunk_tokens, self.batch_tokens, self.max_rows = chunk_tokens, batch_tokens, max_rows
        self.kv_tokens = kv_tokens

    @property
    def max_tokens(self) -> int:
        """Most context + continuation tokens one request may hold: a same-position model reads the last
        token at its own position, a shifted one from the position before it."""
        info = self.adapter.info
        return info.max_length + (1 if info.shifted else 0)

    # ------------------------------------------------------------------ API
    def score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, top_logprobs: int = 0
    ) -> list[TokenScores]:
        """One :class:`TokenScores` per ``(context, continuation)`` request, in order; bad input raises a
        one-line :class:`~s2d2.errors.PromptError` / :class:`~s2d2.errors.ConfigError` before any forward."""
        vocab = self.adapter.info.vocab_size
        if (
            isinstance(top_logprobs, bool)
            or not isinstance(top_logprobs, int)
            or not 0 <= top_logprobs <= vocab
        ):
            raise ConfigError(f"top_logprobs must be an integer in [0, {vocab}], got {top_logprobs!r}")
        pairs = [self._check(i, req) for i, req in enumerate(requests)]
        out = [TokenScores([], [], [] if top_logprobs else None) for _ in pairs]
        pool = self.adapter.new_pool()
        waiting, active, widest = deque(self._jobs(pairs)), [], 0
        while waiting or active:
            while waiting and len(active) < self.max_rows:
                span = max(widest, waiting[0].span)
                if active and (len(active) + 1) * span > self.kv_tokens:
                    break
                job, widest = waiting.popleft(), span
                job.state = pool.new_state()
                active.append(job)
            self._forward(self._take(active), top_logprobs)
            for job in [j for j in active if not j.pieces]:
                pool.release(job.state)
                active.remove(job)
                for i, columns in job.split():
                    out[i] = _token_scores(columns, top_logprobs)
        return out

    # ------------------------------------------------------------------ checks and plans
    def _check(
        self, i: int, request: tuple[Sequence[int], Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Request ``i`` as two ``[n]`` long tensors, or a one-line :class:`PromptError`."""
        info = self.adapter.info
        try:
            context, continuation = request
            ctx = torch.as_tensor(list(context), dtype=torch.long).view(-1)
            cont = torch.as_tensor(list(continuation), dtype=torch.long).view(-1)
        except (TypeError, ValueError, RuntimeError):
            raise PromptError(
                f"request {i}: expected a (context, continuation) pair of token-id sequences"
            ) from None
        both = torch.cat([ctx, cont])
        if both.numel() and (int(both.min()) < 0 or int(both.max()) >= info.vocab_size):
            raise PromptError(f"request {i}: token ids must lie in [0, {info.vocab_size})")
        if bool((both == info.mask_token_id).any()):
            raise PromptError(f"request {i}: the tokens contain the mask token (id {info.mask_token_id})")
        if info.shifted and cont.numel() and not ctx.numel():
            raise PromptError(
                f"request {i}: the context is empty; a shifted model scores a token from the one before it"
            )
        if both.numel() > self.max_tokens:
            raise PromptError(
                f"request {i} is too long: {both.numel()} tokens, the model scores at most {self.max_tokens}"
            )
        return ctx, cont

    def _jobs(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[_Job]:
        """Requests with one context share a job (up to the chunk budget); a continuation longer than
        the budget gets a job of its own, fed in pieces."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, cont) in enumerate(pairs):
            if cont.numel():
                groups.setdefault(tuple(ctx.tolist()), []).append(i)
        jobs: list[_Job] = []
        for members in groups.values():
            ctx = pairs[members[0]][0]
            batch: list[int] = []
            for i in members:
                cost = 2 * pairs[i][1].numel() - 1
                if cost > self.chunk_tokens - 1:
                    jobs.append(self._long_job(i, ctx, pairs[i][1]))
                    continue
                if batch and sum(2 * pairs[j][1].numel() - 1 for j in batch) + cost > self.chunk_tokens - 1:
                    jobs.append(self._branch_job(ctx, [(j, pairs[j][1]) for j in batch]))
                    batch = []
                batch.append(i)
            if batch:
                jobs.append(self._branch_job(ctx, [(j, pairs[j][1]) for j in batch]))
        return jobs

    def _branch_job(self, ctx: torch.Tensor, members: list[tuple[int, torch.Tensor]]) -> _Job:
        """The context in causal pieces, its tail fed with the continuations as branches."""
        branches = [cont for _, cont in members]
        tail = min(ctx.numel(), self.chunk_tokens - sum(2 * b.numel() - 1 for b in branches))
        cut = ctx.numel() - tail
        step = self.chunk_tokens
        pieces = deque(
            _Piece(ctx[a : min(a + step, cut)], min(step, cut - a), []) for a in range(0, cut, step)
        )
        pieces.append(_Piece(ctx[cut:], ctx.numel() - cut, branches))
        return _Job(pieces, members)

    def _long_job(self, i: int, ctx: torch.Tensor, cont: torch.Tensor) -> _Job:
        """Context and continuation as one sequence in pieces of at most ``chunk_tokens`` query tokens
        (an unscored token costs one, a scored one two), each kept in the cache."""
        seq, n_ctx = torch.cat([ctx, cont]), ctx.numel()
        pieces: deque[_Piece] = deque()
        a = 0
        while a < seq.numel():
            plain = min(max(n_ctx - a, 0), self.chunk_tokens)
            b = a + plain
            b += min(seq.numel() - b, (self.chunk_tokens - plain) // 2)
            pieces.append(_Piece(seq[a:b], plain, []))
            a = b
        return _Job(pieces, [(i, cont)])

    # ------------------------------------------------------------------ forwards
    def _take(self, active: list[_Job]) -> list[_Job]:
        """The jobs whose next piece runs in this forward (in order, within the token budget)."""
        chosen, tokens = [], 0
        for job in active:
            cost = job.pieces[0].cost
            if chosen and tokens + cost > self.batch_tokens:
                continue
            chosen.append(job)
            tokens += cost
        return chosen

    def _forward(self, jobs: list[_Job], top: int) -> None:
        """Run each job's next piece as one batched forward; keep what its scored rows say."""
        pieces = [job.pieces.popleft() for job in jobs]
        segments = [
            Segment.of(
                job.state,
                family.score(
                    self.adapter.info, job.state.length, p.prefix, p.branches, score_from=p.score_from
                ),
            )
            for job, p in zip(jobs, pieces, strict=True)
        ]
        for job, logits in zip(jobs, self.adapter.run_and_keep(segments), strict=True):
            k = logits.shape[0]
            if k:
                flat = torch.cat([t for _, t in job.targets])[job.scored : job.scored + k]
                job.parts.append(_read(logits, flat.to(logits.device), top))
                job.scored += k


def _read(logits: torch.Tensor, targets: torch.Tensor, top: int) -> tuple[torch.Tensor, ...]:
    """From AR logits ``[k, vocab]`` of ``targets`` ``[k]``: their log-probabilities ``[k]``, whether each
    is the argmax ``[k]``, and the ``top`` most likely ids and log-probabilities ``[k, top]`` (on the CPU)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(1, targets[:, None])[:, 0]
    greedy = logprobs.argmax(dim=-1) == targets
    values, ids = logprobs.topk(top, dim=-1)
    return picked.cpu(), greedy.cpu(), ids.cpu(), values.cpu()


def _token_scores(columns: tuple[torch.Tensor, ...], top: int) -> TokenScores:
    picked, greedy, ids, values = columns
    best = None
    if top:
        best = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return TokenScores(picked.tolist(), greedy.tolist(), best)


def _offsets(sizes: list[int]) -> list[int]:
    out, at = [], 0
    for k in sizes:
        out.append(at)
        at += k
    return out


def rolling_windows(
    tokens: Sequence[int], prefix_token: int, window: int
) -> list[tuple[list[int], list[int]]]:
    """Disjoint ``(context, continuation)`` windows scoring every token of ``tokens`` once, as lm-eval's
    ``get_rolling_token_windows`` (context length 1) followed by ``make_disjoint_window`` gives them.

    The continuations cut ``tokens`` into runs of ``window`` tokens (the last run shorter); the first run's
    context is ``[prefix_token]``, a later one's the tokens before it that fill ``window + 1`` tokens in
    all. Each window then holds at most ``window + 1`` tokens.
    """
    if window < 1:
        raise ConfigError(f"the rolling window must hold at least one token, got {window}")
    tokens = list(tokens)
    out = []
    for start in range(0, len(tokens), window):
        end = min(start + window, len(tokens))
        context = [prefix_token] if start == 0 else tokens[end - window - 1 : start]
        out.append((context, tokens[start:end]))
    return out

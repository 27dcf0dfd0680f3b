"""One request's state: its tokens, where it stands in its block, its policy, generator and statistics.

A :class:`Request` is created by :meth:`s2d2.engine.llm_engine.LLMEngine.add_request`, walks
WAITING -> RUNNING -> FINISHED (or ABORTED / FAILED), and is retired by the scheduler only. Everything
that makes a row's output independent of its batch-mates lives here: its own random generator, its own
routing-policy state and its own block position and step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import torch

from ..config import DecodeConfig
from ..constraints.matcher import GrammarState
from ..decoding.logits_adjust import LogitsAdjust
from ..decoding.policies import Policy, make_policy
from ..decoding.routing_state import EngineRoutingState
from ..decoding.stats import GenerationStats
from ..errors import PromptError
from ..families.base import ModelInfo
from ..forward.kv_pool import KVState
from .block_cursor import BlockCursor
from .draft_step import DraftStep, SlotDrafts
from .logprobs import TokenLogprob
from .request_limits import draft_room
from .trace import NullTracer, StepTracer, Tracer

#: The commit rule of each baseline decoder (S2D2 uses its ``fallback`` setting).
BASELINE_RULE = {"ar": "static", "static": "static", "dynamic": "dynamic", "eb": "eb"}


@dataclass(frozen=True)
class RowTraits:
    """What a row's settings decide about its steps, once, at admission (:meth:`of`): the one answer to
    "which path does this row take" for the runner (before the forward) and the step (after it).

    ``lane``: "ar" (block size 1, greedy, nothing but the token read), "lossless" (greedy strict
    ``always`` verification reading no scores, no fusion or planner) or None (the general step).
    ``summaries``: every query of the row reads only what the rows' summaries hold (the greedy token,
    its probability, margin, entropy, squared-probability sum: :mod:`~s2d2.forward.vocab_summary`), so
    a tensor-parallel forward may give them instead of the logits."""

    lane: str | None
    greedy: bool
    #: a sampling filter changes the distributions (top-k, top-p, min-p)
    filtered: bool
    grammar: bool
    logprobs: bool
    trace: bool
    #: OpenAI logit adjustments (bias, penalties, ``min_tokens``)
    adjusted: bool
    summaries: bool

    @classmethod
    def of(cls, req: Request) -> RowTraits:
        cfg, pol = req.config, req.policy
        filtered = cfg.top_k != 0 or cfg.top_p < 1.0 or cfg.min_p != 0.0
        grammar, logprobs, trace = req.grammar is not None, cfg.logprobs is not None, bool(cfg.trace)
        adjusted = req.adjust.active
        plain = req.greedy and not (grammar or logprobs or trace or adjusted)
        lane = None
        if plain and cfg.editing_threshold is None and not req.auto_plan:
            if cfg.block_size == 1 and (cfg.sub_block_size or 1) == 1 and pol is None:
                lane = "ar"
            elif (
                pol is not None and pol.fixed is True and cfg.strict and not cfg.fuse and cfg.plan != "auto"
                and not (pol.learns_from_checks or pol.reads_alpha or pol.reads_entropy) and req.rule != "eb"
            ):  # fmt: skip
                lane = "lossless"
        # no alternatives ranked, no distributions kept, every verification strict
        reads_more = cfg.predraft_tokens and (cfg.fuse or req.auto_plan) or pol is not None and not cfg.strict
        summaries = plain and not filtered and not reads_more
        return cls(lane, req.greedy, filtered, grammar, logprobs, trace, adjusted, summaries)


class Action(StrEnum):
    """The forward a row needs next."""

    PREFILL = "prefill"
    DRAFT = "draft"
    VERIFY = "verify"
    #: LLaDA2.1's edit-only pass over a block without masks
    POST = "post"
    #: AR mode's token at the block's first masked slot alone (a planned row's AR-only step; it also
    #: writes the committed tokens not cached yet, which a 2L verification cannot)
    LEAD = "lead"


class Status(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    def __init__(self, value: str) -> None:
        #: whether the request has ended (finished, aborted or failed); a member attribute, not a property,
        #: as the engine reads it for every row every step
        self.done = value in ("finished", "aborted", "failed")


def check_prompt(prompt_ids: Sequence[int] | torch.Tensor, info: ModelInfo) -> torch.Tensor:
    """The prompt as a ``[n]`` long host tensor, or a one-line :class:`PromptError`."""
    try:  # checked on the Python ints (host bookkeeping: no tensor ops a request)
        prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long).view(-1)
        ids = prompt.tolist()
    except (TypeError, ValueError, RuntimeError):
        raise PromptError("prompt token ids must be a flat sequence of integers") from None
    n = len(ids)
    if n == 0:
        raise PromptError("the prompt is empty")
    if min(ids) < 0 or max(ids) >= info.vocab_size:
        raise PromptError(f"prompt token ids must lie in [0, {info.vocab_size})")
    if info.mask_token_id in ids:
        raise PromptError(f"the prompt contains the mask token (id {info.mask_token_id})")
    if n >= info.max_length:
        raise PromptError(
            f"prompt is too long: {n} tokens, the model's context holds {info.max_length} positions "
            "and at least one must be left to generate"
        )
    return prompt


def plans_automatically(cfg: DecodeConfig, info: ModelInfo) -> bool:
    """Whether the step planner may choose the verifications of a request with these settings:
    ``plan="auto"`` on the lossless family of a same-position model (:mod:`.planner`)."""
    return cfg.plan == "auto" and not info.shifted and not cfg.fusion_blockers()


@dataclass(slots=True)
class CacheProgress:
    """How much of a row is in its key/value cache, and how the next forwards may extend it.

    ``state.length`` (the cached positions) has one writer while the row decodes: the step, once after
    each forward (:func:`~.step.apply`: what the forward kept and what a verification accepted into the
    cache), through :meth:`KVState.advance`; the scheduler sets it when it adopts prefix-cache pages at
    admission and empties it on preemption.
    """

    #: prompt positions in whole blocks (they go into the cache before the first draft)
    prompt_blocks: int
    state: KVState | None = None
    #: prompt positions the first draft forward may write itself (its ``pending``), so a prompt that fits
    #: costs no prefill forward of its own; the engine sets it from its adapter
    fold_limit: int = 0
    #: causal cache: the open block's leading slots already in the cache (not fed again)
    block_cached: int = 0
    #: whether this row caches blocks in parts at all (the engine decides from its adapter)
    partial: bool = False
    #: what the row's cached keys/values depend on besides its tokens (prefix-cache pages are shared only
    #: under an equal key); None: the row neither reuses nor publishes cached pages
    prefix_key: Hashable | None = None
    #: positions offered to the prefix cache so far
    published: int = 0
    #: after a preemption: the cached length to recompute before the row resumes (None: never preempted,
    #: or recomputed)
    restore_to: int | None = None

    @property
    def recompute_left(self) -> int:
        """Positions still to recompute after a preemption (0 once the row may resume)."""
        if self.restore_to is None or self.state is None:
            return 0
        return self.restore_to - self.state.length

    @property
    def prefill_left(self) -> int:
        return self.prompt_blocks - (self.state.length if self.state is not None else 0)


@dataclass
class Request:
    """A prompt being decoded with its own settings (see the module docstring)."""

    request_id: Any
    prompt: torch.Tensor
    config: DecodeConfig
    info: ModelInfo
    status: Status = Status.WAITING
    error: str | None = None
    exception: BaseException | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    tracer: Tracer = field(default_factory=NullTracer)
    #: what the next forward of this row is (None: finished)
    action: Action | None = None
    output_ids: list[int] | None = None
    abort_requested: bool = False
    #: the engine's shared routing statistics (used by UCB with ``ucb_scope="engine"``)
    routing: EngineRoutingState | None = field(default=None, repr=False)
    #: makes the request's random generator on the model's device (the engine's ``DeviceOps.generator``)
    make_generator: Any = field(default=None, repr=False)
    #: structured output: the grammar state over the committed output (None: free text)
    grammar: GrammarState | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if greedy_equivalent(self.config):
            self.config = replace(self.config, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
        cfg, info = self.config, self.info
        self.n_prompt = self.prompt.numel()
        self.limit = min(self.n_prompt + cfg.max_new_tokens, info.max_length)
        stop = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else set(info.eos_token_ids))
        self.stop_set = frozenset(stop)
        #: OpenAI logit adjustments, applied to the drafter's and the verifier's logits alike
        self.adjust = LogitsAdjust.of(cfg, stop_ids=sorted(stop), prompt_ids=self.prompt.tolist())
        #: every position's token id on the host (the mask token where not decided yet)
        self.tokens: list[int] = self.prompt.tolist() + [info.mask_token_id] * (
            self.limit + cfg.block_size - self.n_prompt
        )
        seed = cfg.seed if cfg.seed is not None else random.randrange(2**63)
        make = self.make_generator or (lambda s: torch.Generator().manual_seed(s))
        self.generator: torch.Generator = make(seed)
        self.greedy = cfg.temperature == 0
        self.rule = cfg.fallback if cfg.decoder == "s2d2" else BASELINE_RULE[cfg.decoder]
        self.policy: Policy | None = make_policy(cfg, self.routing) if cfg.decoder == "s2d2" else None
        self.unit = cfg.sub_block_size or cfg.block_size
        #: whether the step planner may choose this request's verifications (``plan=auto`` on the
        #: lossless family of a same-position model; :mod:`.planner`)
        self.auto_plan = plans_automatically(cfg, info)
        #: whether its draft forwards carry the AR-mode lead of the first masked slot (planned rows where
        #: the adapter can; set by the engine): that slot's token, AR greedy's, is committed with the
        #: draft, so the first token comes with the first forward after the prompt
        self.ar_lead = False
        #: what its settings decide about its steps (:class:`RowTraits`); set at admission, once the
        #: grammar and the planner's choices are known
        self.traits = RowTraits.of(self)
        if cfg.trace:
            self.tracer = StepTracer()
        n_pre = self.n_prompt // cfg.block_size * cfg.block_size
        self.cache = CacheProgress(prompt_blocks=n_pre)
        self.cursor = BlockCursor(start=n_pre)
        #: absolute position of the stop token that ended the output (None: not found yet)
        self.end: int | None = None
        #: a step waiting for its verification forward
        self.pending: DraftStep | None = None
        #: draft values for the next step from a fused verification (or its stale drafts), with the block
        #: start they belong to
        self.predraft: tuple[int, SlotDrafts, bool] | None = None
        #: the log-probability of each committed position (``config.logprobs``), by absolute position
        self.logprobs: dict[int, TokenLogprob] | None = {} if cfg.logprobs is not None else None
        self.t_start: float | None = None
        #: the row's progress when it last changed, and forwards run since (:mod:`.step.progress`)
        self.progress_mark: tuple[int, ...] | None = None
        self.stalled_forwards = 0

    @property
    def state(self) -> KVState | None:
        return self.cache.state

    @property
    def lane(self) -> str | None:
        """The lane its common steps take (:attr:`RowTraits.lane`)."""
        return self.traits.lane

    # ------------------------------------------------------------------ memory and progress
    @property
    def kv_need(self) -> int:
        """Positions this row may hold in its cache at most (the KV budget's unit)."""
        return self.limit + self.config.block_size

    def commits_pending(self) -> bool:
        """Whether committed tokens before the open block's uncached part are not cached yet."""
        return self.state.length != self.cursor.start + self.cache.block_cached

    def draft_lead(self) -> int | None:
        """The slot whose AR lead the row's next draft forward carries (its first candidate), or None:
        not a planned row that leads (:attr:`ar_lead`), not a draft, or no room for one more query token
        within the engine's bound on a draft forward (:func:`~.request_limits.draft_room`)."""
        if not self.ar_lead or self.action != Action.DRAFT:
            return None
        room = draft_room(self.config.block_size, self.cache.fold_limit)
        return self.cursor.candidates[0] if self.draft_fed() < room else None

    def draft_fed(self) -> int:
        """Tokens the row's next draft forward feeds without a lead: the committed tokens not cached yet
        before the block, then the block from its cached prefix on."""
        cur = self.cursor
        return max(0, cur.start - self.state.length) + cur.length - self.cache.block_cached

    def lead_fed(self) -> int:
        """Tokens an AR-only step feeds (:attr:`Action.LEAD`, or the 2L verification of the first masked
        slot where nothing is pending): the committed tokens not cached yet, then one mask query."""
        cur = self.cursor
        return max(0, cur.start - self.state.length) + cur.candidates[0] - self.cache.block_cached + 1

    def mark_started(self) -> None:
        self.status = Status.RUNNING
        self.t_start = time.perf_counter()

    def final_ids(self) -> list[int]:
        """Generated tokens that can no longer change (for streaming).

        Closed blocks are final; inside the current block the committed run after the prompt is final
        unless token editing may still rewrite it. Finished requests return their output.
        """
        if self.output_ids is not None:
            return self.output_ids
        cur, mask_id = self.cursor, self.info.mask_token_id
        upto = cur.start
        if cur.ids is not None and self.config.editing_threshold is None:
            run = cur.first_generated
            while run < cur.n_valid and cur.ids[run] != mask_id:
                run += 1
            upto = cur.start + run
        upto = min(upto, self.n_prompt + self.config.max_new_tokens)
        if upto <= self.n_prompt:
            return []
        full = self.tokens if cur.ids is None else self.tokens[: cur.start] + cur.ids
        out = full[self.n_prompt : upto]
        for i, t in enumerate(out):
            if t in self.stop_set:
                return out[: i + 1]
        return out

    def cached_tokens(self, n: int) -> list[int]:
        """The token ids of positions ``[0, n)``, all committed (closed blocks, then the open block's
        committed slots): what the first ``n`` cached positions were computed from."""
        cur = self.cursor
        if n <= cur.start or cur.ids is None:
            return self.tokens[:n]
        return self.tokens[: cur.start] + list(cur.ids[: n - cur.start])

    def generated_context(self, block_ids: list[int]) -> list[int]:
        """The generated tokens up to the end of the open block, ``block_ids`` standing for its slots."""
        cur = self.cursor
        return self.tokens[self.n_prompt : cur.start] + block_ids[cur.first_generated :]

    def final_logprobs(self, n: int) -> list[TokenLogprob] | None:
        """Log-probabilities of the first ``n`` generated tokens (None when not asked for)."""
        if self.logprobs is None:
            return None
        return [self.logprobs[self.n_prompt + i] for i in range(n)]


def greedy_equivalent(cfg: DecodeConfig) -> bool:
    """Whether sampling at ``cfg``'s temperature keeps only the most likely token (``top_k`` 1, or
    ``min_p`` 1): then the request decodes as greedy does in every decoder (its drafter's confidences
    are the model's, not those of a one-token distribution)."""
    return cfg.temperature > 0 and (cfg.top_k == 1 or cfg.min_p >= 1.0)

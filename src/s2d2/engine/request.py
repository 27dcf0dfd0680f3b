"""One request's state: its tokens, where it stands in its block, its policy, generator and statistics.

A :class:`Request` is created by :meth:`s2d2.engine.llm_engine.LLMEngine.add_request`, walks
WAITING -> RUNNING -> FINISHED (or ABORTED / FAILED), and is retired by the scheduler only. Everything
that makes a row's output independent of its batch-mates lives here: its own random generator, its own
routing-policy state and its own block position and step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from ..adapters.base import ModelInfo
from ..adapters.kv_pool import KVState
from ..config import DecodeConfig
from ..decoding.policies import Policy, RouteFeatures, SkipCheck, make_policy
from ..decoding.routing_state import EngineRoutingState
from ..decoding.stats import GenerationStats
from ..errors import PromptError
from .trace import NullTracer, StepTracer, Tracer

#: The commit rule of each baseline decoder (S2D2 uses its ``fallback`` setting).
BASELINE_RULE = {"ar": "static", "static": "static", "dynamic": "dynamic", "eb": "eb"}


class Status(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        return self in (Status.FINISHED, Status.ABORTED, Status.FAILED)


def check_prompt(prompt_ids: Sequence[int] | torch.Tensor, info: ModelInfo) -> torch.Tensor:
    """The prompt as a ``[n]`` long tensor, or a one-line :class:`PromptError`."""
    try:
        prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long).view(-1)
    except (TypeError, ValueError, RuntimeError):
        raise PromptError("prompt token ids must be a flat sequence of integers") from None
    n = prompt.numel()
    if n == 0:
        raise PromptError("the prompt is empty")
    if int(prompt.min()) < 0 or int(prompt.max()) >= info.vocab_size:
        raise PromptError(f"prompt token ids must lie in [0, {info.vocab_size})")
    if bool((prompt == info.mask_token_id).any()):
        raise PromptError(f"the prompt contains the mask token (id {info.mask_token_id})")
    if n >= info.max_length:
        raise PromptError(
            f"prompt is too long: {n} tokens, the model's context holds {info.max_length} positions "
            "and at least one must be left to generate"
        )
    return prompt


@dataclass
class PendingVerify:
    """A step whose drafts wait for their verification forward (what the draft forward produced).

    ``cand`` ``[c]`` are the step's candidate slots, ``probs`` ``[c, vocab]`` / ``drafts`` ``[c]`` /
    ``conf`` ``[c]`` the drafter's distributions, tokens and confidences there, ``done`` ``[c]`` which
    candidates are already committed; the span to verify is ``cand[off : off + span_n]``.
    """

    cand: torch.Tensor
    probs: torch.Tensor
    drafts: torch.Tensor
    conf: torch.Tensor
    done: torch.Tensor
    n_committed: int
    off: int
    span_n: int
    quota: int
    features: RouteFeatures | None = None
    verified: bool = False
    #: the verification forward's input: the block with every candidate filled by its draft, and the
    #: block slots of the span
    filled: torch.Tensor | None = None
    slots: list[int] = field(default_factory=list)
    #: fused verification: the pre-draft groups the forward carries (None: a plain 2L verification)
    groups: list[Any] | None = None
    #: a verified step: what skipping would have committed, judged by this verification (for policies
    #: that learn from it)
    check: SkipCheck | None = None


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
    state: KVState | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    tracer: Tracer = field(default_factory=NullTracer)
    #: what the next forward of this row is: "prefill" | "draft" | "verify" | "post" | None (finished)
    action: str | None = None
    output_ids: list[int] | None = None
    abort_requested: bool = False
    #: the engine's shared routing statistics (used by UCB with ``ucb_scope="engine"``)
    routing: EngineRoutingState | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        cfg, info = self.config, self.info
        self.n_prompt = self.prompt.numel()
        self.limit = min(self.n_prompt + cfg.max_new_tokens, info.max_length)
        stop = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else set(info.eos_token_ids))
        self.stop_ids = torch.tensor(sorted(stop), dtype=torch.long)
        self.stop_set = frozenset(stop)
        self.tokens = torch.full((self.limit + cfg.block_size,), info.mask_token_id, dtype=torch.long)
        self.tokens[: self.n_prompt] = self.prompt
        seed = cfg.seed if cfg.seed is not None else random.randrange(2**63)
        self.generator = torch.Generator().manual_seed(seed)
        self.greedy = cfg.temperature == 0
        self.rule = cfg.fallback if cfg.decoder == "s2d2" else BASELINE_RULE[cfg.decoder]
        self.policy: Policy | None = make_policy(cfg, self.routing) if cfg.decoder == "s2d2" else None
        self.unit = cfg.sub_block_size or cfg.block_size
        if cfg.trace:
            self.tracer = StepTracer()
        # prefill: whole blocks of the prompt go into the cache first
        self.n_pre = self.n_prompt // cfg.block_size * cfg.block_size
        #: prompt positions the first draft forward may write to the cache itself (its ``pending``), so a
        #: prompt that fits costs no prefill forward of its own; the engine sets it from its adapter
        self.fold_limit = 0
        # block position
        self.start = self.n_pre
        self.end: int | None = None
        self.block: torch.Tensor | None = None
        self.length = 0
        self.n_valid = 0
        self.first_gen = 0
        self.unit_id = -1
        self.step = 0
        self.hi = 0
        #: committed (non-mask) positions of the current block before this step (routing's progress)
        self.n_committed_block = 0
        #: causal cache: the current block's leading slots already in the cache (not fed again), what the
        #: last draft forward added to them, and whether this request caches blocks in parts at all (the
        #: engine decides from its adapter)
        self.cached = 0
        self.cache_ext = 0
        self.partial_cache = False
        self.cand = torch.zeros(0, dtype=torch.long)
        self.post_left = 0
        self.in_post = False
        self.pending: PendingVerify | None = None
        #: fused verification: draft logits for the next step from the group of the outcome that happened
        self.predraft: Any = None
        self.t_start: float | None = None

    # ------------------------------------------------------------------ memory and progress
    @property
    def kv_need(self) -> int:
        """Positions this row may hold in its cache at most (the KV budget's unit)."""
        return self.limit + self.config.block_size

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
        upto = self.start
        if self.block is not None and self.config.editing_threshold is None:
            masks = (self.block[self.first_gen : self.n_valid] == self.info.mask_token_id).nonzero()
            run = int(masks[0]) if masks.numel() else self.n_valid - self.first_gen
            upto = self.start + self.first_gen + run
        upto = min(upto, self.n_prompt + self.config.max_new_tokens)
        if upto <= self.n_prompt:
            return []
        full = self.tokens if self.block is None else torch.cat([self.tokens[: self.start], self.block])
        out = full[self.n_prompt : upto].tolist()
        stops = set(self.stop_ids.tolist())
        for i, t in enumerate(out):
            if t in stops:
                return out[: i + 1]
        return out

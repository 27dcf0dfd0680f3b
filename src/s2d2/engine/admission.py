"""Admission: a prompt and its settings shaped into a :class:`~.request.Request` the engine can run.

Everything decided once per request, when it is added, lives here: the prompt and limit checks, the block
size chosen for the load and whether the planner plans it step by step (:mod:`.planner`), the prompt
positions a first draft may carry (the fold limit), whether partial blocks are cached, the prefix cache's
key, whether the row may lead with AR steps, and the row's traits (:class:`~.request.RowTraits`: which
lane its common steps take, whether it may read summaries). The engine queues the result; the scheduler
takes it from there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..applicability import refuse_for_family
from ..config import DecodeConfig
from ..constraints.compiler import CompiledConstraint
from ..constraints.matcher import GrammarState
from ..decoding.routing_state import EngineRoutingState
from ..errors import ConfigError
from ..families.base import ModelAdapter
from .planner import StepPlanner, planned_config
from .request import Request, RowTraits, check_prompt, plans_automatically
from .request_limits import RequestLimitError, check_request_limits, fold_limit_for


class Admission:
    """Shapes requests for one engine (see the module docstring); it holds no request itself."""

    def __init__(
        self,
        adapter: ModelAdapter,
        planner: StepPlanner,
        *,
        max_query_tokens_per_row: int,
        prefill_chunk: int,
        prefix_cache: bool,
        make_generator: Callable[[int], torch.Generator],
    ):
        self.adapter = adapter
        self.planner = planner
        self.max_query_tokens_per_row = max_query_tokens_per_row
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self.make_generator = make_generator

    def request(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        config: DecodeConfig,
        rid: Any,
        rows: int,
        routing: EngineRoutingState,
        *,
        constraint: CompiledConstraint | None = None,
    ) -> Request:
        """The request of ``prompt_ids`` under ``config``, shaped for ``rows`` rows sharing its steps (and
        the engine's shared routing statistics, ``routing``, which a caller may replace between requests).

        A bad prompt raises :class:`PromptError`, settings over the engine's limits a
        :class:`~.request_limits.RequestLimitError` naming the setting. Where the settings leave the block
        size open (``plan_block_sizes``), it is chosen for the load (:mod:`.planner.block_size`).
        ``constraint``: structured output (the request's grammar state starts from it)."""
        prompt = check_prompt(prompt_ids, self.adapter.info)
        if constraint is not None:
            self.check_constraint(constraint, config)
        sizes = config.block_size_choices()
        if sizes or plans_automatically(config, self.adapter.info):
            # the settings as asked must fit whatever the load makes of them (refused at every load alike)
            self.check_limits(config)
        if plans_automatically(config, self.adapter.info):
            config = self.planner.admit(config, sizes, prompt.numel(), rows, self.fits)
        elif sizes:  # pragma: no cover - the block size is open only on the lossless family
            config = planned_config(config, sizes, prompt.numel(), rows, self.planner.decide, self.fits)
            self.planner.stats.count_block_choice(config.block_size)
        fold = self.check_limits(config)
        info = self.adapter.info
        req = Request(rid, prompt, config, info, routing=routing, make_generator=self.make_generator)
        req.cache.fold_limit = fold
        if constraint is not None:
            req.grammar = GrammarState(constraint)
        req.cache.partial = (
            self.adapter.caches_partial_blocks and config.causal_cache and config.editing_threshold is None
        )
        req.cache.prefix_key = self.prefix_key(config)
        req.ar_lead = req.auto_plan and self.adapter.supports_lead(config.causal_cache)
        req.traits = RowTraits.of(req)
        refuse_for_family(config, self.adapter.info)
        return req

    def check_constraint(self, constraint: CompiledConstraint, config: DecodeConfig) -> None:
        """Settings structured output cannot honour raise a one-line ConfigError."""
        if constraint.vocab_size != self.adapter.info.vocab_size:
            raise ConfigError(
                f"the constraint was compiled for {constraint.vocab_size} tokens, the model has "
                f"{self.adapter.info.vocab_size}"
            )
        if config.editing_threshold is not None:
            raise ConfigError("structured output cannot be combined with token editing (editing_threshold)")
        if config.ignore_eos:
            raise ConfigError("structured output ends where its grammar does: ignore_eos is not available")

    def prefix_key(self, config: DecodeConfig) -> tuple | None:
        """What a row's cached keys/values depend on besides its tokens: token-causal caches depend on
        nothing else, block-causal ones on the block size. None (no sharing) where the prefix cache is
        off or the family's prefill computes keys unlike its decoding forwards (LLaDA2's official
        prefill mask, where a chunk's keys depend on the chunk)."""
        causal = config.causal_cache
        if not self.prefix_cache or not self.adapter.can_fold_prefill(causal):
            return None
        return ("token-causal",) if causal else ("block-causal", config.block_size)

    def check_limits(self, config: DecodeConfig) -> int:
        """Raise a :class:`~.request_limits.RequestLimitError` if ``config``'s requests could feed one
        forward more than ``max_query_tokens_per_row`` tokens a row; returns their fold limit (the prompt
        positions a first draft may carry)."""
        limit, chunk = self.max_query_tokens_per_row, self.prefill_chunk
        folds = self.adapter.can_fold_prefill(config.causal_cache)
        fold = fold_limit_for(limit, config, chunk) if folds else 0
        check_request_limits(
            config, limit=limit, prefill_chunk=chunk, fold_limit=fold, vocab_size=self.adapter.info.vocab_size
        )
        return fold

    def fits(self, config: DecodeConfig) -> bool:
        try:
            self.check_limits(config)
        except RequestLimitError:
            return False
        return True

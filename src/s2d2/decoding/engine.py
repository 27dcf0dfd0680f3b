"""The generation loop: block by block, step by step, for every decoder.

One loop serves AR (block size 1), the static / dynamic / entropy-bounded baselines and S2D2; they
differ only in how a step chooses what to commit. Model calls go through the adapter protocol
(:mod:`s2d2.adapters.base`). The state is per row (a token buffer, the adapter's KV state, the policy),
so batching can be layered on top without changing the step logic.

Forward accounting: a finished block is committed to the cache inside the next block's first draft
forward (``pending``), so commits cost no forward of their own; ``nfe_commit`` stays 0 unless an
adapter cannot fold.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..adapters.base import ModelAdapter
from ..config import DecodeConfig
from ..errors import PromptError
from . import functional as F
from .policies import RouteFeatures, make_policy
from .stats import GenerationStats, StepTrace

BASELINE_RULE = {"ar": "static", "static": "static", "dynamic": "dynamic", "eb": "eb"}


@dataclass
class DecodeOutput:
    token_ids: list[int]
    stats: GenerationStats
    trace: list[StepTrace] | None = None


def check_prompt(prompt_ids: Sequence[int], adapter: ModelAdapter) -> torch.Tensor:
    info = adapter.info
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


class _Run:
    """State of one row's generation."""

    def __init__(self, adapter: ModelAdapter, cfg: DecodeConfig, prompt: torch.Tensor):
        self.adapter = adapter
        self.cfg = cfg
        self.info = adapter.info
        self.mask_id = self.info.mask_token_id
        self.n_prompt = prompt.numel()
        self.limit = min(self.n_prompt + cfg.max_new_tokens, self.info.max_length)
        stop = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else set(self.info.eos_token_ids))
        self.stop_ids = torch.tensor(sorted(stop), dtype=torch.long)
        self.tokens = torch.full((self.limit + cfg.block_size,), self.mask_id, dtype=torch.long)
        self.tokens[: self.n_prompt] = prompt
        self.generator = torch.Generator().manual_seed(
            cfg.seed if cfg.seed is not None else random.randrange(2**63)
        )
        self.greedy = cfg.temperature == 0
        self.strict = cfg.strict
        self.rule = cfg.fallback if cfg.decoder == "s2d2" else BASELINE_RULE[cfg.decoder]
        self.policy = make_policy(cfg) if cfg.decoder == "s2d2" else None
        self.unit = cfg.sub_block_size or cfg.block_size
        self.state = adapter.new_state()
        self.stats = GenerationStats()
        self.trace: list[StepTrace] | None = [] if cfg.trace else None

    # ------------------------------------------------------------------ helpers
    def _no_mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The mask token is never a prediction: committing it would leave the position masked forever."""
        logits = logits.clone()
        logits[:, self.mask_id] = float("-inf")
        return logits

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return F.probs_from_logits(self._no_mask(logits), c.temperature, c.top_k, c.top_p)

    def _first_stop(self, block: torch.Tensor, lo: int, hi: int) -> int | None:
        if self.stop_ids.numel() == 0 or hi <= lo:
            return None
        hits = torch.isin(block[lo:hi], self.stop_ids).nonzero()
        return lo + int(hits[0]) if hits.numel() else None

    def _draft(self, block: torch.Tensor, start: int) -> torch.Tensor:
        pending = self.tokens[self.state.length : start]
        logits = self.adapter.draft(
            self.state,
            pending,
            block,
            start=start,
            block_size=self.cfg.block_size,
            causal=self.cfg.causal_cache,
        )
        self.stats.nfe_draft += 1
        return logits

    def _edit(
        self, block: torch.Tensor, logits: torch.Tensor, first_gen: int, hi: int, rec: StepTrace | None
    ) -> int:
        """LLaDA2.1-style token editing: replace generated tokens whose prediction changed confidently."""
        tau = self.cfg.editing_threshold
        slots = (block[:hi] != self.mask_id).nonzero().view(-1)
        slots = slots[slots >= first_gen]
        if tau is None or slots.numel() == 0:
            return 0
        probs = self._probs(logits[slots])
        new = F.sample(probs, self.greedy, self.generator)
        conf = F.token_probs(probs, new)
        change = (new != block[slots]) & (conf > tau)
        for s, t in zip(slots[change].tolist(), new[change].tolist(), strict=True):
            block[s] = t
            if rec is not None:
                rec.commits.append((rec.block_start + s, t, "edited"))
        n = int(change.sum())
        self.stats.edits += n
        return n

    # ------------------------------------------------------------------ one step
    def _step(
        self,
        block: torch.Tensor,
        start: int,
        cand: torch.Tensor,
        step: int,
        logits: torch.Tensor,
        rec: StepTrace | None,
    ) -> None:
        cfg = self.cfg
        probs = self._probs(logits[cand])
        drafts = F.sample(probs, self.greedy, self.generator)
        conf = F.token_probs(probs, drafts)
        k = 1 if self.rule == "eb" else F.quota(step, self.unit, cfg.num_steps)
        done = torch.zeros(cand.numel(), dtype=torch.bool)
        n_committed = 0
        off = 0
        if self.info.shifted and int(cand[0]) == 0:
            # a shifted model predicts slot 0 from the previous position: that draft IS the AR token
            block[0] = drafts[0]
            done[0] = True
            n_committed = off = 1
            if rec is not None:
                rec.commits.append((start, int(drafts[0]), "ar"))

        features = None
        verified = False
        if self.policy is not None and off < cand.numel():
            span_cand = cand[off:]
            contiguous = span_cand - span_cand[0] == torch.arange(span_cand.numel())
            span_n = int(contiguous.long().cumprod(0).sum())
            sp = slice(off, off + span_n)
            features = RouteFeatures(
                span_probs=probs[sp],
                span_drafts=drafts[sp],
                block_size=cfg.block_size,
                progress=float((block != self.mask_id).sum()) / block.numel(),
                n_dynamic=int((conf[off:] > cfg.threshold).sum()),
                config=cfg,
            )
            verified = self.policy.decide(features)
            if verified:
                filled = block.clone()
                filled[cand] = drafts
                slots = span_cand[:span_n].tolist()
                q_logits = self.adapter.verify(self.state, filled, start=start, slots=slots)
                self.stats.nfe_verify += 1
                q = self._no_mask(q_logits) if self.strict else self._probs(q_logits)
                n_acc, correction = F.speculative_commit(
                    probs[sp],
                    q,
                    drafts[sp],
                    strict=self.strict,
                    tempering=cfg.tempering,
                    generator=self.generator,
                )
                block[span_cand[:n_acc]] = drafts[off : off + n_acc]
                done[off : off + n_acc] = True
                n_committed += n_acc
                if correction is not None:
                    block[span_cand[n_acc]] = correction
                    done[off + n_acc] = True
                    n_committed += 1
                self.stats.verify_steps += 1
                self.stats.drafted += span_n
                self.stats.accepted += n_acc
                self.stats.full_accepts += int(n_acc == span_n)
                if rec is not None:
                    rec.verified, rec.span, rec.accepted = True, span_n, n_acc
                    rec.commits += [(start + s, int(block[s]), "accepted") for s in slots[:n_acc]]
                    if correction is not None:
                        rec.commits.append((start + slots[n_acc], correction, "resampled"))

        if n_committed < k and not bool(done.all()):
            rest = (~done).nonzero().view(-1)
            need = k - n_committed
            if self.rule == "static":
                sel = F.select_static(conf[rest], need)
            elif self.rule == "dynamic":
                sel = F.select_dynamic(conf[rest], cfg.threshold, need)
            else:
                sel = F.select_entropy_bounded(F.entropy(probs[rest]), cfg.gamma, need)
            chosen = rest[sel]
            block[cand[chosen]] = drafts[chosen]
            n_committed += chosen.numel()
            if self.policy is not None:
                self.stats.fallback_commits += chosen.numel()
            if rec is not None:
                how = "fallback" if self.policy is not None else "baseline"
                rec.commits += [(start + int(cand[i]), int(drafts[i]), how) for i in chosen.tolist()]
        if self.policy is not None and features is not None:
            self.policy.update(features, verified, n_committed)

    # ------------------------------------------------------------------ the loop
    def run(self) -> DecodeOutput:
        cfg, B, M = self.cfg, self.cfg.block_size, self.mask_id
        t0 = time.perf_counter()
        n_pre = self.n_prompt // B * B
        if n_pre:
            self.adapter.prefill(self.state, self.tokens[:n_pre], block_size=B, causal=cfg.causal_cache)
            self.stats.nfe_prefill += 1
        start = n_pre
        end: int | None = None
        while start < self.limit and end is None:
            L = min(B, self.info.max_length - start)
            block = self.tokens[start : start + L].clone()
            n_valid = min(L, self.limit - start)
            first_gen = max(0, self.n_prompt - start)
            self.stats.blocks += 1
            unit_id, step = -1, 0
            while True:
                hi = n_valid
                stop = self._first_stop(block, first_gen, n_valid)
                if stop is not None:
                    hi = stop
                    if not bool((block[first_gen:stop] == M).any()):
                        end = start + stop
                        break
                cand = (block[:hi] == M).nonzero().view(-1)
                if cand.numel() == 0:
                    break
                u = int(cand[0]) // self.unit
                if u != unit_id:
                    unit_id, step = u, 0
                cand = cand[cand < (u + 1) * self.unit]
                rec = StepTrace(block_start=start, step=step) if self.trace is not None else None
                logits = self._draft(block, start)
                self.stats.steps += 1
                if cfg.editing_threshold is not None:
                    self._edit(block, logits, first_gen, hi, rec)
                self._step(block, start, cand, step, logits, rec)
                if rec is not None:
                    self.trace.append(rec)
                step += 1
            if end is None and cfg.editing_threshold is not None:
                for _ in range(cfg.post_steps):  # edit-only passes once the masks are gone
                    rec = StepTrace(block_start=start, step=step) if self.trace is not None else None
                    logits = self._draft(block, start)
                    changed = self._edit(block, logits, first_gen, n_valid, rec)
                    if rec is not None:
                        self.trace.append(rec)
                    if not changed:
                        break
            self.tokens[start : start + L] = block
            start += L
        if end is not None:
            out = self.tokens[self.n_prompt : end + 1]
            self.stats.finish_reason = "stop"
        else:
            out = self.tokens[self.n_prompt : self.limit]
            self.stats.finish_reason = "length"
        self.stats.generated_tokens = out.numel()
        self.stats.seconds = time.perf_counter() - t0
        return DecodeOutput(token_ids=out.tolist(), stats=self.stats, trace=self.trace)


def decode(adapter: ModelAdapter, prompt_ids: Sequence[int], config: DecodeConfig) -> DecodeOutput:
    """Generate from ``prompt_ids`` with ``config``; returns new token ids (through the first stop token)."""
    prompt = check_prompt(prompt_ids, adapter)
    return _Run(adapter, config, prompt).run()

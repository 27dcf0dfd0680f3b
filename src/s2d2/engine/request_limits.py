"""How many query tokens one request may feed to one shared forward (the engine-wide per-row bound).

Every engine step runs all running rows in ONE forward, so a row whose settings make its segment large
delays every batch-mate for as long as that forward takes (and sizes its memory). The engine therefore
bounds the query tokens any row feeds to one forward by ``max_query_tokens_per_row`` and refuses a
request whose settings could exceed it, at :meth:`~s2d2.engine.llm_engine.LLMEngine.add_request`, before
it runs. A request's worst case per forward kind (B = ``block_size``; a block's length L <= B):

* **prefill**: whole blocks of the prompt, max(B, floor(P / B) * B) positions, P the engine's prefill
  chunk (the engine caps P at the bound, so a long prompt costs more forwards, never a larger one: a
  client sending long prompts cannot make forwards larger than one sending large blocks);
* **draft** (also LLaDA2's edit-only post passes): the committed tokens not yet cached (the previous
  block, or on the first draft the folded rest of the prompt, at most the fold limit F) plus the block:
  max(B, F) + B. Sub-blocks (``sub_block_size``) draft inside that block and add nothing;
* **verification**: the 2L layout, 2B (the shifted family's causal verification is shorter);
* **fused verification**: 2B, plus the next block's pre-draft group (B rows), plus, for each of the
  k = min(``predraft_positions``, B - 1) rejection positions (distinct slots c), max(1, T) groups of
  B - c rows, T = min(``predraft_tokens``, vocab - 1): at most max(1, T) * (k B - k (k - 1) / 2).

Pre-draft groups also cost per group, not only per token (each is a mask, a slice of the logits and a
candidate for the next step's pick), so a fused verification may carry at most
:data:`MAX_PREDRAFT_GROUPS` of them per row: 1 + k * max(1, T) groups.

``steps`` (and ``post_steps``) set how many forwards a block takes, not their size: they lengthen the
request's own decoding, not its batch-mates' forwards (``steps`` <= ``block_size`` by DecodeConfig).
The prompt's length is bounded by the context (``check_prompt``) and, per forward, by the prefill chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..config import DecodeConfig
from ..errors import ConfigError
from ..presets import PRESETS

#: The largest block a shipped preset names (the default bound is a whole number of it).
PRESET_BLOCK_SIZE = max(int(p.get("block_size", 1)) for p in PRESETS.values())
#: The largest fused settings ``s2d2 tune`` searches (:mod:`s2d2.tuning.space`: blocks up to 16, up to 6
#: rejection positions with one token each): tuned presets must fit the default bound too.
TUNED_WORST = {"preset": "lossless-fused", "block_size": 16, "predraft_positions": 6, "predraft_tokens": 1}
#: Pre-draft groups a fused verification may carry per row: the most the shipped presets (lossless-fused:
#: the next block + 4 rejection positions = 5) and ``s2d2 tune``'s search space (up to 6 positions with
#: one token each = 7) use, rounded up to a power of two.
MAX_PREDRAFT_GROUPS = 8


class RequestLimitError(ConfigError):
    """A request whose settings exceed an engine-wide limit; ``setting`` names the one to lower."""

    def __init__(self, message: str, setting: str):
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class RowQueryTokens:
    """A request's worst-case query tokens in one forward of each kind (see the module docstring)."""

    prefill: int
    draft: int
    verify: int

    @property
    def worst(self) -> int:
        return max(self.prefill, self.draft, self.verify)

    def kind(self) -> str:
        """The forward kind that reaches :attr:`worst` (the largest one first on a tie)."""
        by_size = {"verification": self.verify, "draft": self.draft, "prefill": self.prefill}
        return max(by_size, key=by_size.__getitem__)


def predraft_rows(block_size: int, positions: int, tokens: int, vocab_size: int) -> int:
    """Rows of a fused verification's pre-draft groups at most: next block's group + rejection groups."""
    k = min(positions, block_size - 1)
    per_position = max(1, min(tokens, vocab_size - 1))
    return block_size + per_position * (k * block_size - k * (k - 1) // 2)


def predraft_groups(config: DecodeConfig, vocab_size: int) -> int:
    """Pre-draft groups of one fused verification at most (0 without fusion)."""
    if not config.fuse:
        return 0
    k = min(config.predraft_positions, config.block_size - 1)
    return 1 + k * max(1, min(config.predraft_tokens, vocab_size - 1))


def prefill_positions(prefill_chunk: int, block_size: int) -> int:
    """Prompt positions one prefill forward writes: the chunk in whole blocks (so the block-causal mask
    stays exact), at least one block."""
    return max(block_size, prefill_chunk // block_size * block_size)


def row_query_tokens(
    config: DecodeConfig, *, prefill_chunk: int, fold_limit: int, vocab_size: int
) -> RowQueryTokens:
    """``config``'s worst-case query tokens per row and forward, on an engine whose prefill chunk is
    ``prefill_chunk`` and whose first draft may carry ``fold_limit`` prompt positions."""
    B = config.block_size
    verify = 2 * B
    if config.fuse:
        verify += predraft_rows(B, config.predraft_positions, config.predraft_tokens, vocab_size)
    return RowQueryTokens(
        prefill=prefill_positions(prefill_chunk, B), draft=draft_room(B, fold_limit), verify=verify
    )


def draft_room(block_size: int, fold_limit: int) -> int:
    """The most query tokens one draft forward feeds (pending tokens and the block); the AR lead of a
    planned row rides only where it fits in this (:meth:`~.request.Request.draft_lead`)."""
    return max(block_size, fold_limit) + block_size


def fold_limit_for(limit: int, config: DecodeConfig, prefill_chunk: int) -> int:
    """The most prompt positions a first draft may carry so that it stays within ``limit`` tokens."""
    return max(0, min(prefill_chunk, limit - config.block_size))


def default_max_query_tokens_per_row(model_block_size: int = 1, own: Iterable[dict[str, Any]] = ()) -> int:
    """The default bound: every shipped preset fits (at its own block size, or at the model's where it
    leaves the block size open), so do the largest settings ``s2d2 tune`` searches (:data:`TUNED_WORST`)
    and the model's own preset settings ``own``; rounded up to a whole number of
    :data:`PRESET_BLOCK_SIZE` (160 for the built-in model: the tuner's worst needs 129). Prompts are
    chunked to the bound, so ``prefill_chunk`` does not raise it."""
    worst = 1
    candidates = [*PRESETS.values(), TUNED_WORST, *own]
    for settings in candidates:
        settings = dict(settings)
        preset = settings.pop("preset", None)
        settings.setdefault("block_size", model_block_size)
        cfg = DecodeConfig.build(preset=preset, **settings)
        tokens = row_query_tokens(cfg, prefill_chunk=1, fold_limit=0, vocab_size=2**31)
        worst = max(worst, tokens.draft, tokens.verify)
    return -(-worst // PRESET_BLOCK_SIZE) * PRESET_BLOCK_SIZE


def _culprit(config: DecodeConfig, limit: int, vocab_size: int) -> str:
    """The first setting whose neutral value alone brings ``config`` within ``limit`` (else block_size)."""
    for name, neutral in (("predraft_tokens", 0), ("predraft_positions", 0), ("fuse", False)):
        if not config.fuse or getattr(config, name) == neutral:
            continue
        trial = dataclasses.replace(config, **{name: neutral})
        if row_query_tokens(trial, prefill_chunk=1, fold_limit=0, vocab_size=vocab_size).verify <= limit:
            return name
    return "block_size"


def _too_many_groups(config: DecodeConfig, groups: int, vocab_size: int) -> RequestLimitError:
    fewer = dataclasses.replace(config, predraft_tokens=min(config.predraft_tokens, 1))
    one_token_fits = predraft_groups(fewer, vocab_size) <= MAX_PREDRAFT_GROUPS
    setting = "predraft_tokens" if one_token_fits else "predraft_positions"
    return RequestLimitError(
        f"{setting}: these settings (predraft_positions {config.predraft_positions}, predraft_tokens "
        f"{config.predraft_tokens}) carry up to {groups} pre-draft groups per row in one verification "
        f"forward, more than the engine's limit of {MAX_PREDRAFT_GROUPS}",
        setting,
    )


def check_request_limits(
    config: DecodeConfig, *, limit: int, prefill_chunk: int, fold_limit: int, vocab_size: int
) -> RowQueryTokens:
    """``config``'s worst case (:func:`row_query_tokens`); a :class:`RequestLimitError` naming the
    setting to lower if it exceeds ``limit`` (the engine's ``max_query_tokens_per_row``)."""
    need = row_query_tokens(config, prefill_chunk=prefill_chunk, fold_limit=fold_limit, vocab_size=vocab_size)
    groups = predraft_groups(config, vocab_size)
    if need.worst <= limit and groups <= MAX_PREDRAFT_GROUPS:
        return need
    if need.worst <= limit:
        raise _too_many_groups(config, groups, vocab_size)
    setting = _culprit(config, limit, vocab_size)
    detail = f"block_size {config.block_size}"
    if config.fuse:
        detail += f", predraft_positions {config.predraft_positions}"
        detail += f", predraft_tokens {config.predraft_tokens}"
    raise RequestLimitError(
        f"{setting}: these settings ({detail}) need up to {need.worst} query tokens per row in one "
        f"{need.kind()} forward, more than the engine's max_query_tokens_per_row of {limit}",
        setting,
    )


__all__ = [
    "RequestLimitError",
    "RowQueryTokens",
    "check_request_limits",
    "MAX_PREDRAFT_GROUPS",
    "default_max_query_tokens_per_row",
    "fold_limit_for",
    "draft_room",
    "predraft_groups",
    "predraft_rows",
    "row_query_tokens",
]

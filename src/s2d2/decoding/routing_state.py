"""Routing statistics shared by the requests of one engine (``ucb_scope="engine"``).

With ``ucb_scope="request"`` (the default) each request's UCB bandit starts empty and forgets what it
learnt when the request ends. With ``ucb_scope="engine"`` the engine owns one :class:`EngineRoutingState`;
every request with the same decoding settings reads and updates the same table of arm statistics, so a
later request (or batch) starts from what earlier ones learnt. A table is keyed by the settings that
decide what a step's reward means (block size, routing and fallback settings, acceptance, sampling), not
by per-request ones (seed, length, stop tokens, trace).

Sharing makes a request's routing depend on the requests decoded before and beside it: the
"batch == alone" guarantee of docs/ENGINE.md holds only for request-scoped policies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import DecodeConfig

#: Settings that do not change what a routing decision earns, so requests differing only in them share.
PER_REQUEST_SETTINGS = frozenset(
    {"seed", "max_new_tokens", "stop_token_ids", "ignore_eos", "trace", "last_block"}
)


def table_key(config: DecodeConfig) -> tuple[tuple[str, Any], ...]:
    """The key of the statistics table ``config``'s requests share."""
    items = dataclasses.asdict(config).items()
    return tuple(sorted((k, v) for k, v in items if k not in PER_REQUEST_SETTINGS))


@dataclass
class EngineRoutingState:
    """One engine's shared UCB statistics: context bucket -> {arm: statistics}, one table per key."""

    tables: dict[tuple[tuple[str, Any], ...], dict[Any, Any]] = field(default_factory=dict)

    def table(self, config: DecodeConfig) -> dict[Any, Any]:
        """The (live, mutable) statistics table for requests with ``config``'s settings."""
        return self.tables.setdefault(table_key(config), {})

    def clear(self) -> None:
        """Forget everything learnt (e.g. between tuning trials)."""
        self.tables.clear()

    def total_pulls(self) -> int:
        """Routing decisions recorded over all tables (arms' pull counts summed)."""
        return sum(arm.pulls for t in self.tables.values() for arms in t.values() for arm in arms.values())


__all__ = ["EngineRoutingState", "PER_REQUEST_SETTINGS", "table_key"]

"""Routing statistics shared by the requests of one engine (``ucb_scope="engine"``), and their file.

With ``ucb_scope="request"`` (the default) each request's UCB bandit starts empty and forgets what it
learnt when the request ends. With ``ucb_scope="engine"`` the engine owns one :class:`EngineRoutingState`;
every request with the same decoding settings reads and updates the same table of arm statistics, so a
later request (or batch) starts from what earlier ones learnt. A table is keyed by the settings that
decide what a step's reward means (block size, routing and fallback settings, acceptance, sampling), not
by per-request ones (seed, length, stop tokens, trace).

Sharing makes a request's routing depend on the requests decoded before and beside it: the
"batch == alone" guarantee of docs/ENGINE.md holds only for request-scoped policies.

The number of tables is bounded: an engine keeps at most ``max_tables`` (``s2d2 serve
--max-routing-tables``); a new settings key past the bound evicts the least recently used table (its
requests already running keep their own reference and go on learning in it, unsaved), and ``evictions``
counts them. A file holding more tables than the bound keeps its most recently used ones.

The statistics outlive the engine only through a file: :meth:`EngineRoutingState.write` saves every
table as JSON (``s2d2 serve --routing-state FILE`` writes it at shutdown) and
:meth:`EngineRoutingState.read` starts a new engine from it (``model.engine.routing = ...``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DecodeConfig
from ..errors import S2D2Error
from ..files import write_text_atomically

#: Settings that do not change what a routing decision earns, so requests differing only in them share.
PER_REQUEST_SETTINGS = frozenset(
    {"seed", "max_new_tokens", "stop_token_ids", "ignore_eos", "trace", "last_block"}
    | {"logit_bias", "presence_penalty", "frequency_penalty", "min_tokens"}  # OpenAI's per-request options
    | {"plan_block_sizes"}  # the block sizes offered: the one chosen is block_size, in the key
)
#: The ``format`` field of a routing-state file, and its version.
FILE_FORMAT, FILE_VERSION = "s2d2-routing-state", 1
#: Tables an engine keeps unless told otherwise (distinct settings keys of ``ucb_scope=engine`` requests).
DEFAULT_MAX_TABLES = 256

TableKey = tuple[tuple[str, Any], ...]


def table_key(config: DecodeConfig) -> TableKey:
    """The key of the statistics table ``config``'s requests share."""
    items = dataclasses.asdict(config).items()
    return tuple(sorted((k, v) for k, v in items if k not in PER_REQUEST_SETTINGS))


@dataclass
class ArmStats:
    """One arm's statistics in one context: pulls and summed reward; the verify arm under
    ``ucb_reward="checked"`` also sums what skipping would have committed on its pulls and how many of
    those tokens the verifications did not vouch for (:class:`~s2d2.decoding.policies.SkipCheck`)."""

    pulls: int = 0
    total: float = 0.0
    skip_commits: int = 0
    skip_unvouched: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else 0.0


#: context bucket -> {arm (True = verify, False = skip): statistics}
Table = dict[tuple[int, ...], dict[bool, ArmStats]]


@dataclass
class EngineRoutingState:
    """One engine's shared UCB statistics: one :data:`Table` per settings key, at most ``max_tables``
    of them (least recently used first in ``tables``; ``evictions`` counts the tables dropped)."""

    tables: OrderedDict[TableKey, Table] = field(default_factory=OrderedDict)
    max_tables: int = DEFAULT_MAX_TABLES
    evictions: int = 0
    #: the model tokenizer's decode (ids -> text), for the ``syntax`` policy's static checks; set by the
    #: model that owns the engine, never saved to the file
    detokenize: Callable[[Sequence[int]], str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tables, int) or self.max_tables < 1:
            raise S2D2Error(f"max_tables must be an integer >= 1, got {self.max_tables!r}")
        self.tables = OrderedDict(self.tables)
        self._trim()

    def table(self, config: DecodeConfig) -> Table:
        """The (live, mutable) statistics table for requests with ``config``'s settings (now the most
        recently used; a new one may evict the least recently used)."""
        key = table_key(config)
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = {}
            self._trim()
        else:
            self.tables.move_to_end(key)
        return table

    def set_max_tables(self, max_tables: int) -> None:
        """Bound the tables to ``max_tables`` from now on (evicting the least recently used beyond it)."""
        if not isinstance(max_tables, int) or max_tables < 1:
            raise S2D2Error(f"max_tables must be an integer >= 1, got {max_tables!r}")
        self.max_tables = max_tables
        self._trim()

    def _trim(self) -> None:
        while len(self.tables) > self.max_tables:
            self.tables.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        """Forget everything learnt (e.g. between tuning trials)."""
        self.tables.clear()

    def total_pulls(self) -> int:
        """Routing decisions recorded over all tables (arms' pull counts summed)."""
        return sum(arm.pulls for t in self.tables.values() for arms in t.values() for arm in arms.values())

    # ------------------------------------------------------------------ the file
    def to_dict(self) -> dict[str, Any]:
        """The JSON document of :meth:`write` (tables least recently used first)."""
        tables = []
        for key, table in list(self.tables.items()):
            contexts = [
                {
                    "context": list(ctx),
                    "verify": dataclasses.asdict(arms[True]),
                    "skip": dataclasses.asdict(arms[False]),
                }
                for ctx, arms in table.items()
            ]
            tables.append({"settings": dict(key), "contexts": contexts})
        return {"format": FILE_FORMAT, "version": FILE_VERSION, "tables": tables}

    @classmethod
    def from_dict(
        cls, doc: Any, source: str = "routing state", max_tables: int = DEFAULT_MAX_TABLES
    ) -> EngineRoutingState:
        """The state a :meth:`to_dict` document describes, its last (most recently used) ``max_tables``
        tables only; a one-line ``S2D2Error`` if it is malformed."""
        if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
            raise S2D2Error(f"{source}: not an s2d2 routing-state file (format {FILE_FORMAT!r})")
        if doc.get("version") != FILE_VERSION:
            raise S2D2Error(f"{source}: unsupported version {doc.get('version')!r} (expected {FILE_VERSION})")
        state = cls(max_tables=max_tables)
        try:
            entries = doc["tables"]
            if not isinstance(entries, list):
                raise TypeError("'tables' is not a list")
            state.evictions = max(0, len(entries) - max_tables)
            for entry in entries[state.evictions :]:
                key = tuple(sorted(entry["settings"].items()))
                state.tables[key] = {
                    tuple(int(x) for x in c["context"]): {True: _arm(c["verify"]), False: _arm(c["skip"])}
                    for c in entry["contexts"]
                }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise S2D2Error(f"{source}: malformed table ({exc.__class__.__name__}: {exc})") from None
        return state

    def write(self, path: str | os.PathLike[str]) -> None:
        """Save every table to ``path`` as JSON (atomically; a one-line ``S2D2Error`` if it fails)."""
        write_text_atomically(path, json.dumps(self.to_dict()))

    @classmethod
    def read(cls, path: str | os.PathLike[str], max_tables: int = DEFAULT_MAX_TABLES) -> EngineRoutingState:
        """The state saved in ``path`` by :meth:`write` (at most ``max_tables`` tables, see
        :meth:`from_dict`); a one-line ``S2D2Error`` if it cannot be read."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise S2D2Error(
                f"cannot read the routing state {path}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise S2D2Error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(doc, str(path), max_tables)


def _arm(d: Any) -> ArmStats:
    """An arm's statistics from its JSON object (only the known fields; counts must be integers >= 0)."""
    arm = ArmStats(
        pulls=int(d["pulls"]),
        total=float(d["total"]),
        skip_commits=int(d.get("skip_commits", 0)),
        skip_unvouched=int(d.get("skip_unvouched", 0)),
    )
    if min(arm.pulls, arm.skip_commits, arm.skip_unvouched) < 0:
        raise ValueError("negative count")
    return arm


__all__ = ["ArmStats", "DEFAULT_MAX_TABLES", "EngineRoutingState", "PER_REQUEST_SETTINGS", "table_key"]

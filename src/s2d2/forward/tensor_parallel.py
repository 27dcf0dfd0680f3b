"""Tensor parallelism inside the forward: what one rank's shard of the model exchanges with the others.

A model of ``size`` ranks is split by heads (q/k/v column-parallel, the output projection row-parallel),
by the MLP's intermediate columns, by vocabulary (embedding and LM head) and, for a mixture of experts,
by experts. Every rank holds the same hidden states ``[T, hidden]`` between layers: a row-parallel
projection's partial sums are added by one all-reduce (:meth:`TensorParallel.reduce`), so a layer costs
two all-reduces (attention, MLP or mixture of experts). The embedding looks up the rank's vocabulary
slice and all-reduces; the LM head's logits ``[L, vocab / size]`` stay on their ranks where the step reads
only their summaries (:mod:`.vocab_summary`: a gather of a few values a row, :meth:`TensorParallel.
summarize`), and are gathered to rank 0 (the driver) where it needs whole rows (``L x vocab`` values).

Rank 0 runs the engine. Before each forward it sends every other rank ONE message (:meth:`send`: a
pickled object broadcast as one uint8 tensor after its length) holding the batch description; the
ranks run the same forward on their shards (:func:`s2d2.parallel.rank_loop.serve_forwards`). The ranks'
key/value pools hold their own heads at the same pages: only rank 0's scheduler decides pages, the
others follow the page tables the batch carries.

A collective that fails (a rank died: its connection closes at once) or does not complete within
``timeout_s`` (a rank hangs) raises :class:`RankFailure`; the group is then broken and every later
forward raises the same error at once.

One process is a group of one rank, :class:`OneRank`: its collectives are no-ops and its forward runs
at once, so the lean forward has one path whatever the group (a null object, not ``None`` checks).
"""

from __future__ import annotations

import itertools
import math
import pickle
import threading
import weakref
from collections import deque
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .vocab_summary import LOCAL_WIDTH, combine, local_summary

#: environment variable set in every rank process but the driver (its rank): finds them
RANK_ENV = "S2D2_TP_RANK"
#: seconds a collective may wait for the other ranks (a hung rank fails the forward after it)
DEFAULT_TIMEOUT_S = 60.0
#: a rank waiting for rank 0's next message waits this long (an idle server sends none)
IDLE_TIMEOUT = timedelta(days=365)


class RankFailure(RuntimeError):
    """A rank of the tensor-parallel group died or did not answer in time; the group is unusable."""


class OneRank:
    """The group of one process (the whole model here): every collective is a no-op and a forward runs at
    once, with no message. The same interface as :class:`TensorParallel`, which the lean forward calls
    without asking which it has."""

    rank, size, driver = 0, 1, True
    broken: str | None = None

    def __init__(self, vocab_size: int):
        #: the LM head's output width
        self.vocab_size = vocab_size
        self.kept: torch.Tensor | None = None

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself: nothing to add on one rank."""
        return x

    def embed(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``ids``: ``[T, hidden]``."""
        return F.embedding(ids, weight)

    def add_row_parallel(self, x: torch.Tensor, o: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        """``x + linear(o)`` (``x`` ``[T, hidden]``): one fused multiply-add where ``linear`` has no bias."""
        if linear.bias is None:
            return torch.addmm(x, o, linear.weight.t())
        return x + linear(o)

    def row_parallel(self, o: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        """``linear(o)``."""
        return linear(o)

    def logits(self, local: torch.Tensor, summary: int | None) -> torch.Tensor:
        """The LM head's output ``[L, vocab]`` itself, or with ``summary`` (the token to exclude) the rows'
        summaries ``[L, WIDTH]`` (:mod:`.vocab_summary`)."""
        if summary is None:
            return local
        self.kept = local
        return combine(local_summary(local, 0, self.vocab_size, summary)[None])

    def gather_kept(self) -> torch.Tensor:
        """The logits of the last summarized forward."""
        if self.kept is None:
            raise RuntimeError("no summarized forward to take the logits of")
        return self.kept

    def forward(self, message: Any, run: Any, plan: Any = None) -> Any:
        """``run()``: no other rank to send ``message`` to."""
        return run()

    def announce(self, pool: Any, options: dict[str, Any]) -> None:
        """Nothing: no other rank keeps a pool."""


class TensorParallel:
    """One rank's view of its group: ``rank`` of ``size``, the process group of the forward's collectives
    (``group``, gloo on the CPU or NCCL on CUDA) and the one carrying rank 0's messages (``control``, gloo;
    the other ranks wait on it without a time limit)."""

    def __init__(self, rank: int, size: int, group: Any, control: Any, *, timeout_s: float):
        self.rank, self.size = rank, size
        self.group, self.control = group, control
        self.timeout_s = timeout_s
        #: why the group is unusable (None: it works)
        self.broken: str | None = None
        #: one forward (its message and its collectives) at a time
        self.lock = threading.RLock()
        self._pool_ids = itertools.count(1)
        #: the vocabulary (set by the adapter) and this rank's logits of the last summarized forward
        self.vocab_size = 0
        self.kept: torch.Tensor | None = None
        #: values gathered to rank 0 so far: full logits, and summaries (:meth:`summarize`)
        self.logit_values = 0
        self.summary_values = 0
        #: collectives issued in the current forward (:meth:`forward`); the device of their tensors
        self.issued = 0
        self.device = torch.device("cpu")
        self._dropped: deque[int] = deque()

    @property
    def driver(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives
    def _guard(self, what: str, fn):
        if self.broken is not None:
            raise RankFailure(self.broken)
        try:
            return fn()
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.broken = (
                f"a tensor-parallel rank died or hung: {what} on rank {self.rank} of {self.size} failed "
                f"(a rank gets {self.timeout_s:g} s): {first[:160]}"
            )
            raise RankFailure(self.broken) from None

    def _collective(self, what: str, fn):
        """One of a forward's collectives (counted: :meth:`forward` completes the rest after a failure)."""
        self.issued += 1
        return self._guard(what, fn)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place (every rank gets the sum); returns ``x``."""
        if self.size > 1:
            self._collective("all-reduce", lambda: self.group.allreduce([x]).wait())
        return x

    def _gather(self, what: str, local: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``local`` (same shape) on rank 0, in rank order (an empty list on the others)."""
        outs = [torch.empty_like(local) for _ in range(self.size)] if self.driver else []
        opts = torch.distributed.GatherOptions()
        opts.rootRank = 0
        self._collective(what, lambda: self.group.gather([outs] if self.driver else [], [local], opts).wait())
        return outs

    def vocab_slice(self, vocab: int) -> tuple[int, int]:
        """This rank's vocabulary ``[start, start + per)`` (``per = ceil(vocab / size)``; the last rank's
        slice is padded past ``vocab`` with zero rows)."""
        per = math.ceil(vocab / self.size)
        return self.rank * per, per

    def embed(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: ``weight`` ``[per, hidden]`` is this rank's slice; tokens outside it
        look up zeros and the all-reduce adds the owners' rows. ``[T, hidden]``."""
        per = weight.shape[0]
        local = ids - self.rank * per
        inside = (local >= 0) & (local < per)
        out = F.embedding(local.clamp(0, per - 1), weight).masked_fill_(~inside[:, None], 0.0)
        return self.reduce(out)

    def row_parallel(self, o: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        """``linear(o)`` of a row-parallel ``linear`` (this rank's input columns): the partial sums added
        over the ranks, then the bias once."""
        out = self.reduce(F.linear(o, linear.weight))
        return out if linear.bias is None else out + linear.bias

    def add_row_parallel(self, x: torch.Tensor, o: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        """``x + linear(o)`` of a row-parallel ``linear`` (:meth:`row_parallel`)."""
        return x + self.row_parallel(o, linear)

    def gather_logits(self, local: torch.Tensor, vocab: int) -> torch.Tensor | None:
        """The full logits ``[L, vocab]`` on rank 0 from each rank's ``[L, per]`` (None on the others)."""
        if self.size == 1:
            return local[:, :vocab]
        local = local.contiguous()
        self.logit_values += local.numel() * self.size
        outs = self._gather("logits gather", local)
        return torch.cat(outs, dim=1)[:, :vocab] if self.driver else None

    def summarize(self, local: torch.Tensor, exclude: int) -> torch.Tensor | None:
        """The rows' summaries ``[L, WIDTH]`` on rank 0 (None on the others) from each rank's logits
        ``[L, per]`` (:mod:`.vocab_summary`): a gather of ``L x LOCAL_WIDTH`` values a rank instead of the
        logits. Each rank keeps its logits for :meth:`gather_kept` until its next forward."""
        self.kept = local
        first, _ = self.vocab_slice(self.vocab_size)
        mine = local_summary(local, first, self.vocab_size, exclude).contiguous()
        if self.size == 1:
            return combine(mine[None])
        self.summary_values += mine.numel() * self.size
        parts = self._gather("summary gather", mine)
        return combine(torch.stack(parts)) if self.driver else None

    def logits(self, local: torch.Tensor, summary: int | None) -> torch.Tensor | None:
        """The LM head's output ``local`` ``[L, per]`` as rank 0 reads it: the full logits
        (:meth:`gather_logits`), or with ``summary`` (the token to exclude) the summaries
        (:meth:`summarize`); None on the other ranks."""
        if summary is None:
            return self.gather_logits(local, self.vocab_size)
        return self.summarize(local, summary)

    def gather_kept(self) -> torch.Tensor | None:
        """The full logits ``[L, vocab]`` of the last summarized forward on rank 0 (None on the others)."""
        if self.kept is None:
            raise RuntimeError("no summarized forward to take the logits of")
        return self.gather_logits(self.kept, self.vocab_size)

    # ------------------------------------------------------------------ messages from rank 0
    def send(self, message: Any) -> None:
        """Rank 0: broadcast ``message`` (with any pools dropped since the last one) to every rank."""
        data = np.frombuffer(pickle.dumps((list(self._drain()), message), protocol=5), dtype=np.uint8)
        size = torch.tensor([data.size], dtype=torch.long)
        blob = torch.from_numpy(data.copy())

        def go() -> None:
            self.control.broadcast([size], _from_rank_0()).wait()
            self.control.broadcast([blob], _from_rank_0()).wait()

        self._guard("sending a batch", go)

    def forward(self, message: Any, run: Any, plan: Any = None) -> Any:
        """Rank 0: send ``message`` (a forward) and run this rank's part of it (``run()``), one forward at
        a time.

        A failure on this rank after the message left leaves the others waiting in a collective this rank
        never joins. With ``plan`` (``plan()``: the forward's collectives in order, ``(kind, numel,
        dtype)``, kind "reduce" or "gather") this rank joins the rest of them with zeros, so every rank
        ends the forward, and the error is raised as it is: the group is in step again (the others
        wrote garbage keys and values at the batch's slots, which no length covers; a re-run rewrites
        them, as one process's fault isolation does). Without a plan, or where that fails too, the group
        is broken and it raises :class:`RankFailure`."""
        with self.lock:
            self.send(message)
            self.issued = 0
            try:
                return run()
            except RankFailure:
                raise
            except Exception as exc:
                if plan is not None:
                    try:
                        self._complete(plan())
                    except RankFailure:
                        raise
                    except Exception:  # (then out of step: broken below)
                        pass
                    else:
                        raise exc from None
                self.broken = (
                    f"a tensor-parallel rank died or hung: the forward failed on rank 0 and the ranks "
                    f"cannot be brought back in step ({type(exc).__name__}: {str(exc)[:160]})"
                )
                raise RankFailure(self.broken) from exc

    def _complete(self, plan: list[tuple[str, int, torch.dtype]]) -> None:
        """Join the collectives of ``plan`` this forward has not issued yet, with zeros."""
        for kind, numel, dtype in plan[self.issued :]:
            zeros = torch.zeros(numel, dtype=dtype, device=self.device)
            if kind == "reduce":
                self.reduce(zeros)
            else:
                self._gather("gather", zeros)

    def receive(self) -> tuple[list[int], Any]:
        """A rank but 0: the next message (waits as long as rank 0 is idle)."""
        size = torch.zeros(1, dtype=torch.long)
        self._guard("waiting for a batch", lambda: self.control.broadcast([size], _from_rank_0()).wait())
        blob = torch.empty(int(size), dtype=torch.uint8)
        self._guard("receiving a batch", lambda: self.control.broadcast([blob], _from_rank_0()).wait())
        return pickle.loads(blob.numpy().tobytes())

    def announce(self, pool: Any, options: dict[str, Any]) -> None:
        """Rank 0: every rank makes a pool like ``pool`` (``options``: its sizes) of its own heads; the
        ranks drop theirs when ``pool`` is gone."""
        pool.tp_id = next(self._pool_ids)
        with self.lock:
            self.send(("pool", pool.tp_id, options))
        weakref.finalize(pool, self.dropped, pool.tp_id)

    def dropped(self, pool_id: int) -> None:
        """A pool of rank 0 is gone: the ranks free theirs with the next message (thread-safe)."""
        self._dropped.append(pool_id)

    def _drain(self):
        while self._dropped:
            yield self._dropped.popleft()


def collectives(
    dec: Any, tokens: int, rows: int, summary: int | None, gather: bool = True
) -> list[tuple[str, int, torch.dtype]]:
    """A tensor-parallel forward's collectives in order, ``(kind, numel, dtype)``, for the model's lean
    forward ``dec`` (its layers, LM head and dtype): the embedding's and each layer's two all-reduces of
    ``[tokens, hidden]``, then the LM head's gather of ``rows`` (logits or, with ``summary``, their
    reductions; none where ``gather`` is off)."""
    per, hidden = dec.lm_head.weight.shape
    plan = [("reduce", tokens * hidden, dec.dtype)] * (1 + 2 * len(dec.layers))
    if gather:
        width, dtype = (per, dec.dtype) if summary is None else (LOCAL_WIDTH, torch.float32)
        plan.append(("gather", rows * width, dtype))
    return plan


def _from_rank_0() -> Any:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    return opts


def process_groups(
    rank: int, size: int, host: str, port: int, device: torch.device, timeout_s: float, *, store: Any = None
) -> TensorParallel:
    """Join the group of ``size`` ranks whose rank 0 serves the TCP store at ``host:port`` (``store``: rank
    0's own): the forward's group (NCCL on CUDA, gloo on the CPU; ``timeout_s``) and the gloo group of
    rank 0's messages."""
    import torch.distributed as dist

    limit = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, size, False, timeout=max(limit, timedelta(seconds=120)))
        store.set(f"s2d2/started/{rank}", "1")
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = limit
        group = dist.ProcessGroupNCCL(dist.PrefixStore("s2d2/forward", store), rank, size, opts)
    else:
        group = dist.ProcessGroupGloo(dist.PrefixStore("s2d2/forward", store), rank, size, limit)
    wait = limit if rank == 0 else IDLE_TIMEOUT
    control = dist.ProcessGroupGloo(dist.PrefixStore("s2d2/control", store), rank, size, wait)
    tp = TensorParallel(rank, size, group, control, timeout_s=timeout_s)
    tp.store = store  # kept alive with the groups
    tp.device = device
    return tp

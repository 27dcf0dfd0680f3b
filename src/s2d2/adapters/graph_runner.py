"""The forward replayed at the GPU's pace: static buffers per padded batch shape, one CUDA graph each.

A small forward is launch-bound: on an H200 the eager 8B forward costs about 1,900 kernel launches. A
CUDA graph replays all of them as one. :class:`StaticRunner` pads each batch to a bucket shape
(:func:`bucket`: tokens, rows, queries a row and pages a row rounded up to powers of two; logits to the
tokens), keeps one static int64 buffer per shape (the batch's one host-to-device copy lands there), and
on CUDA captures the forward body over those buffers once per shape, then replays it; batches above
``max_tokens`` run eagerly. Without graphs (``graphs=False``) it runs the body on the same static
buffers: the replay emulation the CPU tests compare against a fresh eager run (stale state in a static
buffer would show there).

A graph is captured at the first batch of its shape (one line on stderr each) and recaptured if the
key/value pool was reallocated (a pool that grows moves its tensors). Models whose forward cannot be
captured (a mixture-of-experts MLP routes tokens by data) run eagerly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .forward_batch import FIELDS, BatchShape, ForwardBatch

#: the fewest padded tokens (and pages a row) a bucket has
MIN_TOKENS, MIN_WIDTH = 16, 4


def _up(n: int, lo: int = 1) -> int:
    """The least power of two >= ``max(n, lo)``."""
    n = max(n, lo)
    return 1 << (n - 1).bit_length()


def bucket(shape: BatchShape, max_tokens: int) -> BatchShape | None:
    """The padded shape a batch of ``shape`` runs at, or None above ``max_tokens`` padded tokens."""
    tokens = _up(shape.tokens, MIN_TOKENS)
    if tokens > max_tokens:
        return None
    return BatchShape(tokens, _up(shape.rows), _up(shape.n_q), _up(shape.width, MIN_WIDTH), tokens)


@dataclass
class _Entry:
    blob: torch.Tensor
    batch: ForwardBatch
    graph: Any = None
    out: torch.Tensor | None = None
    pool_ptr: int = 0
    #: the capture failed: this shape runs the body eagerly on its static buffers
    failed: bool = False


class StaticRunner:
    """Runs ``body(batch) -> logits [L_pad, vocab]`` on static buffers per bucket shape (see the module
    docstring). ``pool_ptr()`` identifies the key/value storage the graphs were captured against."""

    def __init__(
        self,
        body: Callable[[ForwardBatch], torch.Tensor],
        device: torch.device,
        *,
        graphs: bool,
        pool_ptr: Callable[[], int] = lambda: 0,
        max_tokens: int = 512,
        max_shapes: int = 48,
        log: Callable[[str], None] | None = None,
    ):
        self.body, self.device, self.graphs = body, torch.device(device), graphs
        self.pool_ptr, self.max_tokens, self.max_shapes = pool_ptr, max_tokens, max_shapes
        self.log = log if log is not None else (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.entries: dict[BatchShape, _Entry] = {}
        self.mempool = torch.cuda.graph_pool_handle() if graphs else None
        #: forwards replayed (or run on static buffers) and forwards run eagerly
        self.replays = self.eager = 0

    def shape_for(self, shape: BatchShape) -> BatchShape | None:
        """The bucket a batch of ``shape`` runs at here (None: eagerly)."""
        padded = bucket(shape, self.max_tokens)
        if padded is None or (padded not in self.entries and len(self.entries) >= self.max_shapes):
            return None
        return padded

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[L, vocab]`` of a host batch already padded to a bucket shape (:meth:`shape_for`), a
        tensor of the caller's own (logits may be kept past the next forward: a shifted model's saved
        row)."""
        parts = np.concatenate([np.asarray(getattr(batch, f), dtype=np.int64) for f in FIELDS])
        entry = self.entries.get(batch.shape)
        if entry is None:
            entry = self.entries[batch.shape] = self._entry(batch, parts.size)
        entry.blob.copy_(torch.from_numpy(parts), non_blocking=False)
        self.replays += 1
        n_logits = sum(batch.logit_sizes)
        if not self.graphs or entry.failed:
            return self.body(entry.batch)[:n_logits]
        if entry.graph is None or entry.pool_ptr != self.pool_ptr():
            try:
                self._capture(entry, batch.shape)
            except RuntimeError as exc:  # report and run this shape eagerly rather than fail the request
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self.log(f"s2d2: CUDA graph capture failed ({why}); this shape runs eagerly")
                entry.failed, entry.graph = True, None
                return self.body(entry.batch)[:n_logits]
        entry.graph.replay()
        return entry.out[:n_logits].clone()  # the caller's own: the next replay overwrites the static output

    def _entry(self, batch: ForwardBatch, size: int) -> _Entry:
        blob = torch.zeros(size, dtype=torch.long, device=self.device)
        sizes = [np.asarray(getattr(batch, f)).size for f in FIELDS]
        views = blob.split(sizes)
        static = ForwardBatch(batch.rows, batch.tokens, batch.n_q, batch.width, batch.page_size,
                              list(batch.logit_sizes), *views)  # fmt: skip
        return _Entry(blob, static)

    def _capture(self, entry: _Entry, shape: BatchShape) -> None:
        """Warm the body up on a side stream, then capture it into the shared graph memory pool."""
        self.log(f"s2d2: capturing a CUDA graph for {shape.tokens} tokens, {shape.rows} rows x {shape.n_q} "
                 f"queries, {shape.width} pages a row ({len(self.entries)} shapes)")  # fmt: skip
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.body(entry.batch)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            entry.out = self.body(entry.batch)
        entry.graph, entry.pool_ptr = graph, self.pool_ptr()

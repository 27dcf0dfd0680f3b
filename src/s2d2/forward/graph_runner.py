"""The forward replayed at the GPU's pace: static buffers per padded batch shape, one CUDA graph each.

A small forward is launch-bound: on an H200 the eager 8B forward costs about 1,900 kernel launches. A
CUDA graph replays all of them as one. :class:`StaticRunner` pads each batch to a bucket shape
(:func:`bucket`: tokens, rows, queries a row and pages a row rounded up to powers of two; logits to the
tokens), keeps one static int64 buffer per shape (the batch's one host-to-device copy lands there), and
on CUDA captures the forward body over those buffers once per shape, then replays it; batches above
``max_tokens`` run eagerly. Without graphs (``graphs=False``) it runs the body on the same static
buffers: the replay emulation the CPU tests compare against a fresh eager run (stale state in a static
buffer would show there).

The common shapes (:func:`load_shapes`: decoding and block steps of 1 to 64 rows) are captured together
when an engine's key/value pool is made (:meth:`StaticRunner.prepare`, one progress line); any other
shape is captured at its first batch (one line on stderr each). A graph is recaptured if the key/value
pool was reallocated (a pool that grows moves its tensors). Models whose forward cannot be captured (a
mixture-of-experts MLP routes tokens by data) run eagerly.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .forward_batch import FIELDS, BatchShape, ForwardBatch

#: the fewest padded tokens (and pages a row) a bucket has
MIN_TOKENS, MIN_WIDTH = 16, 4
#: the shapes captured with an engine's pool: rows, queries a row and pages a row (contexts to 128 and 256
#: positions at 16 a page) of :func:`load_shapes`
LOAD_ROWS, LOAD_QUERIES, LOAD_WIDTHS = (1, 2, 4, 8, 16, 32, 64), (1, 16), (8, 16)


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


def load_shapes(max_tokens: int = 512) -> list[BatchShape]:
    """The bucket shapes captured when an engine's pool is made: every row count of :data:`LOAD_ROWS`
    feeding one token a row (decoding) or a block of up to 16 (drafts, verifications), at the
    :data:`LOAD_WIDTHS`, up to ``max_tokens`` padded tokens."""
    out = []
    for width in LOAD_WIDTHS:
        for n_q in LOAD_QUERIES:
            for rows in LOAD_ROWS:
                tokens = _up(rows * n_q, MIN_TOKENS)
                if tokens <= max_tokens:
                    out.append(BatchShape(tokens, rows, n_q, width, tokens))
    return out


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
        max_shapes: int = 64,
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
            sizes = [np.asarray(getattr(batch, f)).size for f in FIELDS]
            entry = self.entries[batch.shape] = self._entry(batch.shape, sizes, batch.page_size)
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

    def _entry(self, shape: BatchShape, sizes: list[int], page_size: int) -> _Entry:
        """Zeroed static buffers of ``shape`` (``sizes``: each field's length). All zeros is a valid batch:
        every token writes the zero page's first slot and sees key 0 alone."""
        blob = torch.zeros(sum(sizes), dtype=torch.long, device=self.device)
        static = ForwardBatch(shape.rows, shape.tokens, shape.n_q, shape.width, page_size,
                              [shape.logits], *blob.split(sizes))  # fmt: skip
        return _Entry(blob, static)

    def prepare(
        self, shapes: list[BatchShape], sizes: Callable[[BatchShape], list[int]], page_size: int
    ) -> int:
        """Static buffers for each of ``shapes`` (up to ``max_tokens`` and ``max_shapes``) and, with graphs,
        its graph captured now on the zeroed buffers; without, the body run once on them (the emulation).
        One progress line (updated in place on a terminal). Graphs captured against another pool (a
        calibration's) are dropped first: they would be recaptured anyway, and they hold graph memory and
        places among ``max_shapes``. Returns how many shapes were prepared."""
        ptr = self.pool_ptr()
        for shape in [s for s, e in self.entries.items() if e.graph is not None and e.pool_ptr != ptr]:
            del self.entries[shape]
        todo = [s for s in dict.fromkeys(shapes) if s.tokens <= self.max_tokens]
        room = self.max_shapes - sum(s not in todo for s in self.entries)
        todo = todo[: max(0, room)]
        what = "CUDA graphs" if self.graphs else "static buffers"
        t0, tty = time.perf_counter(), sys.stderr.isatty()
        for i, shape in enumerate(todo, 1):
            entry = self.entries.get(shape)
            if entry is None:
                entry = self.entries[shape] = self._entry(shape, sizes(shape), page_size)
            if not self.graphs:
                self.body(entry.batch)
            elif entry.graph is None or entry.pool_ptr != self.pool_ptr():
                try:
                    self._capture(entry, shape, quiet=True)
                except RuntimeError:  # as at first use: this shape runs eagerly (reported once, below)
                    entry.failed, entry.graph = True, None
            if tty:
                print(f"\rs2d2: capturing {what}: {i}/{len(todo)} batch shapes", end="", file=sys.stderr)
        failed = sum(self.entries[s].failed for s in todo)
        note = f" ({failed} failed: eager)" if failed else ""
        self.log(f"{chr(13) if tty else ''}s2d2: captured {what} of {len(todo) - failed} batch shapes in "
                 f"{time.perf_counter() - t0:.1f} s{note}")  # fmt: skip
        return len(todo)

    def _capture(self, entry: _Entry, shape: BatchShape, quiet: bool = False) -> None:
        """Warm the body up on a side stream, then capture it into the shared graph memory pool."""
        if not quiet:
            self.log(f"s2d2: capturing a CUDA graph for {shape.tokens} tokens, {shape.rows} rows x "
                     f"{shape.n_q} queries, {shape.width} pages a row ({len(self.entries)} shapes)")
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.body(entry.batch)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            entry.out = self.body(entry.batch)
        entry.graph, entry.pool_ptr = graph, self.pool_ptr()

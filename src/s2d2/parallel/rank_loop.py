"""What a tensor-parallel rank other than 0 does: run the forwards rank 0 sends, on its shard.

Each message (:meth:`~s2d2.forward.tensor_parallel.TensorParallel.receive`) is one of

* ``("pool", id, options)``: make a key/value pool of this rank's heads, as rank 0 made its own;
* ``("batch", id, pages, batch, summary)``: run the :class:`~s2d2.forward.forward_batch.ForwardBatch`
  against pool ``id`` (grown to ``pages`` pages first: rank 0's pool grows as its scheduler takes pages),
  giving rank 0 the full logits or, with ``summary`` (the token to exclude), their summaries;
* ``("logits",)``: give rank 0 the full logits of the last forward of summaries;
* ``("segments", id, pages, segments, tables)``: the grouped forward of segments with their page tables;
* ``("stop",)``: return.

Every message carries the pools rank 0 has dropped since the last one. The rank writes only its own pools'
keys and values, at the slots the batch names: which page holds what is rank 0's scheduler's alone.
"""

from __future__ import annotations

import torch

from ..forward.fastpath import FastDecoder
from ..forward.kv_pool import KVPool
from ..forward.tensor_parallel import TensorParallel


def grow_to(pool: KVPool, pages: int) -> None:
    """Storage for at least ``pages`` pages (rank 0's pool size) in ``pool``."""
    if pool.k[0].shape[1] - 1 < pages:
        pool.pages.grow(pages)
        pool._allocate(pages)


@torch.inference_mode()
def serve_forwards(fast: FastDecoder, tp: TensorParallel) -> None:
    """Run rank 0's forwards until it sends ``stop``; a failed collective raises
    :class:`~s2d2.forward.tensor_parallel.RankFailure` (rank 0 is gone or a rank hangs)."""
    pools: dict[int, KVPool] = {}
    while True:
        dropped, msg = tp.receive()
        for pool_id in dropped:
            pools.pop(pool_id, None)
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "pool":
            pools[msg[1]] = fast.new_pool(**msg[2])
            continue
        if kind == "logits":
            tp.gather_kept()
            continue
        pool = pools[msg[1]]
        grow_to(pool, msg[2])
        if kind == "batch":
            fast.run_batch(pool, msg[3].to(fast.device), msg[4])
        elif kind == "segments":
            fast.grouped_forward(pool, msg[3], msg[4])
        else:
            raise RuntimeError(f"unknown message {kind!r} from rank 0")

"""The forward body at the GPU's pace, proven on the CPU: it compiles whole (no host syncs, no branches on
data) at two bucket sizes; the static-buffer replay emulation equals a fresh eager run, for one forward
and for a whole generation; buckets pad every size up and leave the largest batches eager; an engine's
pool gets the common shapes prepared (captured, on CUDA) at once, with one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import s2d2
from s2d2.bench.suites import load_problems
from s2d2.engine.llm_engine import LLMEngine
from s2d2.forward.forward_batch import FIELDS, BatchShape, build_batch, field_sizes, grid_queries
from s2d2.forward.graph_runner import bucket, load_shapes
from s2d2.layouts.mask_spec import spec_of


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load("tiny-gsm", use_preset=False, device="cpu")


def _rows(fast, lengths=(20, 7, 33)):
    pool = fast.new_pool(page_size=16)
    states = [pool.new_state() for _ in lengths]
    gen = torch.Generator().manual_seed(1)
    for st, n in zip(states, lengths, strict=True):  # caches of random keys
        pool.ensure(st, n + 16)
        for i in range(len(fast.layers)):
            for t in (pool.k[i], pool.v[i]):
                t[:, pool.table(st)] = torch.randn(t[:, pool.table(st)].shape, generator=gen)
        st.length = n
    return pool, states


def _batch(fast, pool, states, sizes, seed, pad=None, max_q=None):
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in sizes]
    pos = [list(range(st.length, st.length + n)) for st, n in zip(states, sizes, strict=True)]
    full = [torch.ones(n, n, dtype=torch.bool) for n in sizes]
    specs = [spec_of(m.tril() if r % 2 else m) for r, m in enumerate(full)]  # causal and bidirectional rows
    tables = [pool.table(st) for st in states]
    rows = [torch.arange(n) for n in sizes]
    lengths = [st.length for st in states]
    heads = dict(n_heads=fast.n_heads, n_kv=fast.n_kv)
    return build_batch(lengths, ids, pos, specs, tables, rows, pool.page_size, **heads, pad=pad, max_q=max_q)


@pytest.mark.parametrize("max_q", [1, 2, 5])
def test_rows_cut_into_short_grid_rows_give_the_same_logits(tiny, max_q):
    """A prefill-sized row among short ones, its queries cut into grid rows of at most ``max_q`` (each with
    the row's pages and key numbering): the logits are the one-grid-row-a-row batch's."""
    fast = tiny.adapter.fast
    pool, states = _rows(fast)
    whole = _batch(fast, pool, states, (2, 13, 1), seed=3)
    cut = _batch(fast, pool, states, (2, 13, 1), seed=3, max_q=max_q)
    assert cut.rows == sum(-(-n // max_q) for n in (2, 13, 1)) and cut.n_q == min(max_q, 13)
    want = fast.run_batch(pool, whole.to("cpu"))
    got = fast.run_batch(pool, cut.to("cpu"))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), float((got - want).abs().max())


def test_the_grid_cut_keeps_decode_rows_apart_from_a_prefill_chunk():
    assert grid_queries([2] * 30 + [48]) == 2  # the chunk takes 24 short grid rows, not 30 rows 48 wide
    assert grid_queries([9] * 16 + [8] * 16) == 9  # drafts and verifications: one grid row each
    assert grid_queries([4, 4, 4]) == 4
    with pytest.raises(ValueError, match="max_q"):
        build_batch([0], [[1]], [[0]], [spec_of(torch.ones(1, 1, dtype=torch.bool))], [[1]],
                    [torch.arange(1)], 16, max_q=0)  # fmt: skip


def test_the_forward_body_compiles_whole_at_two_bucket_sizes(tiny):
    compiles_whole(tiny.adapter.fast)


def compiles_whole(fast) -> None:
    """The forward body under ``torch.compile(fullgraph=True, backend="aot_eager")`` at two bucket sizes
    gives the eager logits (no host sync, no branch on data)."""
    pool, states = _rows(fast)
    body = torch.compile(
        lambda b: fast.run_batch(pool, b), fullgraph=True, backend="aot_eager", dynamic=False
    )
    for sizes, pad in (((3, 5, 1), BatchShape(16, 4, 8, 4, 16)), ((8, 2, 4), BatchShape(32, 4, 8, 4, 32))):
        with torch.no_grad():
            compiled = body(_batch(fast, pool, states, sizes, 0, pad).to("cpu"))
            eager = fast.run_batch(pool, _batch(fast, pool, states, sizes, 0).to("cpu"))
        assert compiled.shape[0] == pad.logits
        assert torch.allclose(compiled[: sum(sizes)], eager, atol=1e-5)


def test_static_buffer_replay_equals_a_fresh_eager_run(tiny):
    fast = tiny.adapter.fast
    pool, states = _rows(fast)
    runner = fast.static_runner(graphs=False)
    fast._pool = pool
    outs = []
    for seed, sizes in ((0, (3, 5, 1)), (1, (4, 1, 6)), (2, (2, 7, 2))):
        shape = _batch(fast, pool, states, sizes, seed).shape
        pad = runner.shape_for(shape)
        assert pad == BatchShape(16, 4, 8, 4, 16)  # one bucket: the same static buffers every time
        with torch.inference_mode():
            replayed = runner.run(_batch(fast, pool, states, sizes, seed, pad)).clone()
            eager = fast.run_batch(pool, _batch(fast, pool, states, sizes, seed).to("cpu"))
        assert torch.allclose(replayed, eager, atol=1e-5)
        outs.append(replayed)
    assert len(runner.entries) == 1 and runner.replays == 3
    assert not torch.allclose(outs[0][:3], outs[1][:3])  # the buffers held each batch's own data


@pytest.mark.parametrize("config", ["ar", "lossless-auto"])
def test_a_generation_on_static_buffers_gives_the_eager_tokens(tiny, config):
    fast = tiny.adapter.fast
    prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 6)]
    from s2d2.bench.throughput import pick_configs

    (bench,) = pick_configs([config])
    cfg = tiny.make_config(tiny.checkpoint_config(), **bench.expanded(), seed=0, max_new_tokens=24)
    tiny.max_num_seqs, tiny._engine = 3, None
    eager = [r.token_ids for r in tiny.generate_batch(prompts, cfg)]
    fast.static = fast.static_runner(graphs=False, max_tokens=64)
    try:
        tiny._engine = None
        replayed = [r.token_ids for r in tiny.generate_batch(prompts, cfg)]
        assert fast.static.replays > 10 and fast.static.entries
    finally:
        fast.static = None
    assert replayed == eager


def test_buckets_pad_every_size_up_and_leave_the_largest_batches_eager():
    assert bucket(BatchShape(5, 3, 3, 2, 4), 512) == BatchShape(16, 4, 4, 4, 16)
    assert bucket(BatchShape(300, 64, 5, 9, 300), 512) == BatchShape(512, 64, 8, 16, 512)
    assert bucket(BatchShape(513, 1, 513, 40, 1), 512) is None


def test_graphs_are_for_cuda_and_enforce_eager_turns_them_off(tiny):
    fast = tiny.adapter.fast
    assert fast.static is None and fast.enforce_eager  # the CPU runs eagerly
    fast.enforce_eager = False
    assert fast.static is None
    with pytest.raises(ValueError, match="does not fit"):
        pool, states = _rows(fast)
        _batch(fast, pool, states, (9, 1, 1), 0, pad=BatchShape(16, 4, 8, 4, 16))


def test_a_shape_whose_capture_fails_runs_eagerly_and_says_so(tiny, monkeypatch):
    fast = tiny.adapter.fast
    pool, states = _rows(fast)
    said: list[str] = []
    runner = fast.static_runner(graphs=False, log=said.append)
    runner.graphs = True  # as on CUDA, with a capture that fails

    def broken(entry, shape):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(runner, "_capture", broken)
    fast._pool = pool
    with torch.inference_mode():
        batch = _batch(fast, pool, states, (3, 5, 1), 0)
        out = runner.run(_batch(fast, pool, states, (3, 5, 1), 0, runner.shape_for(batch.shape)))
        eager = fast.run_batch(pool, batch.to("cpu"))
    assert torch.allclose(out, eager, atol=1e-5)
    assert said == ["s2d2: CUDA graph capture failed (operation not permitted when stream is capturing); "
                    "this shape runs eagerly"]  # fmt: skip


def test_a_shapes_field_sizes_are_its_batches(tiny):
    fast = tiny.adapter.fast
    pool, states = _rows(fast)
    for sizes, pad in (((3, 5, 1), BatchShape(16, 4, 8, 4, 16)), ((8, 2, 4), BatchShape(32, 4, 8, 8, 32))):
        batch = _batch(fast, pool, states, sizes, 0, pad)
        assert field_sizes(pad, fast.n_heads) == [np.asarray(getattr(batch, f)).size for f in FIELDS]


def test_an_engines_pool_gets_the_common_shapes_prepared_at_once(tiny):
    fast = tiny.adapter.fast
    said: list[str] = []
    fast.static = fast.static_runner(graphs=False, log=said.append)  # the replay emulation, as on CUDA
    hits: list[BatchShape] = []
    real_run = fast.static.run
    fast.static.run = lambda b: hits.append(b.shape) or real_run(b)
    try:
        assert tiny.adapter.new_pool().new_state() is not None and not fast.static.entries  # not an engine's
        engine = LLMEngine(tiny.adapter, max_num_seqs=4, capture_graphs=True)
        shapes = load_shapes(fast.static.max_tokens)
        assert set(fast.static.entries) == set(shapes) and fast._pool is engine.pool
        assert len(said) == 1 and said[0].startswith(f"s2d2: captured static buffers of {len(shapes)} batch")
        prepared = dict(fast.static.entries)
        prompts = [tiny.encode(p["question"]) for p in load_problems("tiny-gsm", "test", 4)]
        cfg = tiny.make_config(preset="lossless", block_size=8, max_new_tokens=16)
        replayed = [o.token_ids for o in engine.generate(prompts, [cfg] * 4)]
        assert any(s in prepared for s in hits)  # batches ran on the buffers prepared with the pool
        assert all(fast.static.entries[s] is e for s, e in prepared.items())
    finally:
        fast.static = None
    eager = [o.token_ids for o in LLMEngine(tiny.adapter, max_num_seqs=4).generate(prompts, [cfg] * 4)]
    assert replayed == eager
    assert fast.capture(fast.new_pool()) == 0  # the CPU: nothing to capture


def test_graphs_of_another_pool_make_room_for_an_engines_pool(tiny):
    fast = tiny.adapter.fast
    runner = fast.static_runner(graphs=False, log=lambda msg: None, max_shapes=2)
    sizes = lambda s: field_sizes(s, fast.n_heads)  # noqa: E731
    fast._pool = fast.new_pool()
    stale, kept = BatchShape(16, 1, 16, 4, 16), BatchShape(16, 2, 1, 4, 16)
    wanted = BatchShape(16, 1, 1, 8, 16)
    for shape in (stale, kept):
        runner.entries[shape] = runner._entry(shape, sizes(shape), 16)
    runner.entries[stale].graph, runner.entries[stale].pool_ptr = object(), -1  # captured on another pool
    assert runner.prepare([wanted, BatchShape(32, 2, 16, 4, 32)], sizes, 16) == 1  # room for one
    assert set(runner.entries) == {kept, wanted}

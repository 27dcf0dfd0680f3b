"""Faults of a two-rank model in the library: a bad tensor_parallel_size is one line before any process
starts; a hung rank (stopped with SIGSTOP) fails the running requests with a clear error once the group's
timeout (here 3 s) has passed, every later request fails at once, and closing the model leaves no rank."""

from __future__ import annotations

import os
import signal
import time

import pytest

import s2d2
from conftest import assert_one_line_error, run_cli, tiny_model_path
from s2d2.errors import ModelLoadError
from s2d2.forward.tensor_parallel import RANK_ENV

pytestmark = pytest.mark.tensor_parallel


def _children_with_rank() -> list[int]:
    out = []
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and any(e.startswith(f"{RANK_ENV}=".encode()) for e in env):
            out.append(pid)
    return out


@pytest.mark.parametrize(
    ("size", "backend", "fragment"),
    [
        (3, "mp", "does not divide the model's 4 attention heads"),
        (0, "mp", "tensor_parallel_size must be an integer >= 1"),
        (2, "threads", "unknown distributed_executor_backend 'threads'"),
    ],
)
def test_a_bad_size_is_one_line_before_any_process(size, backend, fragment):
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    with pytest.raises(ModelLoadError, match=fragment) as info:
        s2d2.load("tiny-gsm", device="cpu", tensor_parallel_size=size, distributed_executor_backend=backend)
    assert "\n" not in str(info.value)
    assert _children_with_rank() == []


def test_a_hung_rank_fails_the_requests_within_the_timeout(monkeypatch):
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    monkeypatch.setenv("S2D2_TP_TIMEOUT_S", "3")
    model = s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=4, tensor_parallel_size=2)
    ranks = model.adapter.ranks
    try:
        (rank,) = _children_with_rank()
        prompts = ["Tom has 3 apples. He buys 4 more. How many apples does he have?"] * 3
        assert all(not r.error for r in model.generate_batch(prompts, max_new_tokens=8, errors="return"))
        os.kill(rank, signal.SIGSTOP)
        start = time.monotonic()
        results = model.generate_batch(prompts, max_new_tokens=8, errors="return")
        took = time.monotonic() - start
        assert all("tensor-parallel rank died or hung" in (r.error or "") for r in results), results
        assert took < 45, took  # the timeout (3 s) for the first collective, at once after it (a busy CI)
        again = model.generate_batch(prompts[:1], max_new_tokens=8, errors="return")
        assert "tensor-parallel rank died or hung" in (again[0].error or "")
    finally:
        ranks.close(wait_s=1.0)
    assert _children_with_rank() == []


@pytest.mark.parametrize("where", ["before its first collective", "after five collectives"])
def test_a_failure_on_rank_0_after_the_message_fails_its_row_alone(monkeypatch, where):
    """The other rank already runs the forward (it waits in a collective rank 0 never joins): rank 0
    joins the rest of the forward's collectives with zeros, so both ranks end it in step; then fault
    isolation re-runs the batch in halves as one process does, the row that causes the failure fails
    alone, and its batch-mates decode the tokens of one process."""
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    monkeypatch.setenv("S2D2_TP_TIMEOUT_S", "20")  # a forward out of step fails in 20 s, not 60
    one = s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=4)
    model = s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=4, tensor_parallel_size=2)
    ranks, fast, tp = model.adapter.ranks, model.adapter.fast, model.adapter.tp
    questions = ("Tom has 3 apples. He buys 4 more.", "Tom has 5 apples. He buys 2 more.")
    prompts = [one.encode(q) for q in questions]
    marker = max(max(p) for p in prompts) + 1
    cfg = dict(max_new_tokens=12, preset="lossless", block_size=4)
    try:
        run_batch, reduce, armed = fast.run_batch, tp.reduce, []

        def runs(pool, batch, summary=None):
            armed[:] = [marker in batch.ids.tolist()]
            if armed[0] and where.startswith("before"):
                armed[0] = False
                raise MemoryError("out of memory on rank 0")
            return run_batch(pool, batch, summary)

        def reduces(x):
            if armed and armed[0] and tp.issued == 5:
                armed[0] = False
                raise MemoryError("out of memory on rank 0")
            return reduce(x)

        monkeypatch.setattr(fast, "run_batch", runs)
        monkeypatch.setattr(tp, "reduce", reduces)
        results = model.generate_batch([*prompts, prompts[0][:3] + [marker]], errors="return", **cfg)
        assert "out of memory on rank 0" in (results[2].error or ""), results[2]
        assert [r.token_ids for r in results[:2]] == [r.token_ids for r in one.generate_batch(prompts, **cfg)]
        assert tp.broken is None
        again = model.generate_batch(prompts[1:], **cfg)  # the group works on
        assert again[0].token_ids == results[1].token_ids
    finally:
        ranks.close(wait_s=1.0)
    assert _children_with_rank() == []


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "-m", "tiny-gsm", "-tp", "3", "hi"],
        ["serve", "-m", "tiny-gsm", "--tensor-parallel-size", "3"],
        ["eval", "gsm8k", "-m", "tiny-gsm", "-tp", "3", "--data", "PROBLEMS"],
        ["generate", "-m", "tiny-gsm", "-tp", "2", "--distributed-executor-backend", "threads", "hi"],
    ],
)
def test_cli_refuses_a_bad_size_in_one_line(capsys, tmp_path, args):
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    problems = tmp_path / "gsm8k.jsonl"
    problems.write_text('{"question": "Tom has 3 apples.", "answer": "3 #### 3"}\n')
    code, _, err = run_cli(capsys, *[str(problems) if a == "PROBLEMS" else a for a in args])
    assert_one_line_error(code, err)
    assert "tensor_parallel_size 3 does not divide" in err or "unknown distributed_executor_backend" in err
    assert _children_with_rank() == []


def test_lm_eval_model_args_take_the_size():
    pytest.importorskip("lm_eval")
    from s2d2.evaluation.lm_eval_model import S2D2LM

    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    with pytest.raises(ModelLoadError, match="tensor_parallel_size 3 does not divide"):
        S2D2LM(model="tiny-gsm", device="cpu", tensor_parallel_size="3")
    lm = S2D2LM(model="tiny-gsm", device="cpu", tensor_parallel_size="2", max_new_tokens="8")
    try:
        assert len(lm.model.adapter.ranks.param_bytes) == 2
    finally:
        lm.model.adapter.ranks.close()

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


def test_a_failure_on_rank_0_after_the_message_breaks_the_group(monkeypatch):
    """The other ranks already run the forward (they wait in its all-reduce): rank 0 cannot re-run the
    batch in halves as one process does (fault isolation); every request fails with the group's error."""
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    model = s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=4, tensor_parallel_size=2)
    ranks, fast = model.adapter.ranks, model.adapter.fast
    try:

        def fails(pool, batch, summary=None):
            raise MemoryError("out of memory on rank 0")

        monkeypatch.setattr(fast, "run_batch", fails)
        results = model.generate_batch(["Tom has 3 apples."] * 2, max_new_tokens=8, errors="return")
        assert all("cannot be brought back in step" in (r.error or "") for r in results), results
        assert "MemoryError" in ranks.tp.broken
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

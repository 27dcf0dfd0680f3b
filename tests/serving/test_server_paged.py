"""`s2d2 serve` on paged KV memory (issue 26): real HTTP, a real server, the official openai client.

- ``usage.prompt_tokens_details.cached_tokens`` (completions and chat, streamed with ``include_usage``);
- streaming under preemption: a page budget of about three requests' worth for 8 rows and 32 concurrent
  streaming clients; every stream equals the same prompt's non-streamed greedy text;
- multi-turn chat: each earlier turn is prefilled once (:func:`test_multi_turn_chat_reuses_earlier_turns`);
- ``s2d2 bench-serve --shared-prefix N`` and the KV gauges and counters of ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import free_port, metric, running_server  # noqa: E402

import s2d2  # noqa: E402
from conftest import assert_one_line_error, run_cli  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.serving.chat import chat_prompt_ids  # noqa: E402
from s2d2.serving.protocol import ChatMessage  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:32]]
MAX_TOKENS = 48
PAGE = 16  # --kv-page-size (the default) and the shipped preset's block size
ROWS = 8
SYSTEM = "Answer the question."


def _floor(n: int, multiple: int = PAGE) -> int:
    return n // multiple * multiple


def _reusable(prompt_tokens: int) -> int:
    """The most positions a prompt of this length can adopt from the cache: the prompt's whole blocks
    (its partial last block is decoded with the answer's first one; tiny-gsm predicts at the same
    position, so no position must be computed again)."""
    return _floor(prompt_tokens)


@pytest.fixture(scope="module")
def ref():
    """The library alone (no server, no prefix cache, no budget): the greedy texts to compare with."""
    return s2d2.load("tiny-gsm", max_num_seqs=ROWS, prefix_cache=False)


@pytest.fixture(scope="module")
def expected(ref):
    results = ref.generate_batch(QUESTIONS, max_new_tokens=MAX_TOKENS)
    return {q: r.text for q, r in zip(QUESTIONS, results, strict=True)}


@pytest.fixture(scope="module")
def cached_url():
    """A server with the prefix cache on (the default) and no page budget."""
    model = s2d2.load("tiny-gsm", max_num_seqs=ROWS)
    with running_server(create_app(model, max_num_seqs=ROWS, max_queue=64)) as base:
        yield base


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _wait_idle(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(url, "s2d2_running_rows") or metric(url, "s2d2_waiting_rows"):
        assert time.monotonic() < deadline, "the server did not go idle"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------- usage
def test_usage_reports_cached_prompt_tokens(cached_url, ref):
    """``usage.prompt_tokens_details.cached_tokens``: the prompt positions the prefix cache served, in
    the non-streamed body and in the last streamed chunk (``include_usage``), completions and chat."""
    client = _client(cached_url)
    prompt = QUESTIONS[0] + " " + QUESTIONS[1]  # two questions: a prompt over two pages
    n_prompt = len(ref.encode(prompt))
    first = client.completions.create(model="tiny-gsm", prompt=prompt, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens == n_prompt
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # a new prompt
    again = client.completions.create(model="tiny-gsm", prompt=prompt, max_tokens=8, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == _reusable(n_prompt) > 0  # all a prompt can reuse
    assert again.choices[0].text == first.choices[0].text
    chunks = list(
        client.completions.create(
            model="tiny-gsm",
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
    chat = [
        client.chat.completions.create(
            model="tiny-gsm",
            messages=msgs,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for _ in range(2)
    ]
    usages = [list(stream)[-1].usage for stream in chat]
    assert usages[0].prompt_tokens_details.cached_tokens == 0  # "System: ..." starts no cached prompt
    assert usages[1].prompt_tokens_details.cached_tokens == _reusable(usages[1].prompt_tokens)
    # n choices are engine requests of their own: each counts the positions it adopted (the sum may
    # exceed prompt_tokens, which counts the prompt once)
    two = client.completions.create(model="tiny-gsm", prompt=prompt, max_tokens=8, temperature=0, n=2)
    assert two.usage.prompt_tokens == n_prompt and two.usage.prompt_tokens_details.cached_tokens == 2 * cached


# ---------------------------------------------------------------------------------------------- preemption
@contextmanager
def serve_cli(*extra: str):
    """``s2d2 serve`` (the CLI, so its flags are what is tested) in a subprocess on a free port."""
    port = free_port()
    cmd = [sys.executable, "-m", "s2d2.cli", "serve", "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("s2d2 serve did not start")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base
    finally:
        proc.kill()
        proc.wait(10)


async def _all(url: str, stream: bool) -> list[tuple[list[str], str, int]]:
    """Every question at once (32 clients): (streamed pieces, text, completion tokens) each."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)

    async def one(q: str) -> tuple[list[str], str, int]:
        args = dict(model="tiny-gsm", prompt=q, max_tokens=MAX_TOKENS, temperature=0)
        if not stream:
            r = await client.completions.create(**args)
            return [], r.choices[0].text, r.usage.completion_tokens
        pieces, usage = [], None
        async for chunk in await client.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        ):
            pieces += [c.text for c in chunk.choices if c.text]
            usage = chunk.usage or usage
        return pieces, "".join(pieces), usage.completion_tokens

    try:
        return await asyncio.wait_for(asyncio.gather(*(one(q) for q in QUESTIONS)), timeout=60)
    finally:
        await client.close()


def test_streaming_under_preemption(ref, expected):
    """A budget of three requests' pages for 8 rows: rows are preempted and resumed, yet all 32
    concurrent greedy streams equal the non-streamed texts (and the library's), with no text repeated."""
    need = max(len(ref.encode(q)) for q in QUESTIONS) + MAX_TOKENS + PAGE  # prompt, answer, a block
    budget = 3 * -(-need // PAGE) * PAGE
    with serve_cli("--max-num-seqs", str(ROWS), "--kv-budget-tokens", str(budget)) as url:
        t0 = time.monotonic()
        plain = asyncio.run(_all(url, stream=False))
        streamed = asyncio.run(_all(url, stream=True))
        seconds = time.monotonic() - t0
        _wait_idle(url)
        preemptions = metric(url, "s2d2_preemptions_total")
        used = metric(url, "s2d2_kv_pages_used")
        total = used + metric(url, "s2d2_kv_pages_free") + metric(url, "s2d2_kv_pages_cached")
        failed = metric(url, 's2d2_requests_total{status="failed"}')
    assert seconds < 60
    assert preemptions > 0 and failed == 0
    assert used == 0 and total == budget // PAGE  # idle: every page free or cached, within the budget
    for q, (_, text, tokens), (pieces, joined, stream_tokens) in zip(QUESTIONS, plain, streamed, strict=True):
        assert text == expected[q]
        assert joined == text and stream_tokens == tokens  # the stream repeats nothing and misses nothing
        assert all(pieces)


# ---------------------------------------------------------------------------------------------- multi-turn
def _conversation(url: str, turns: int) -> list[tuple[list[dict], str, int, int]]:
    """A greedy chat of ``turns`` turns, each sending the whole conversation so far: (messages sent,
    answer, prompt_tokens, cached_tokens) per turn."""
    client, msgs, out = _client(url), [{"role": "system", "content": SYSTEM}], []
    for q in QUESTIONS[:turns]:
        msgs.append({"role": "user", "content": q})
        r = client.chat.completions.create(
            model="tiny-gsm", messages=msgs, max_tokens=MAX_TOKENS, temperature=0
        )
        answer = r.choices[0].message.content
        out.append((list(msgs), answer, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        msgs.append({"role": "assistant", "content": answer})
    return out


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_multi_turn_chat_reuses_earlier_turns(cached_url, ref):
    """Each turn of a 4-turn chat prefills the earlier turns once, not again at every turn.

    tiny-gsm has no chat template; the server's fallback (:mod:`s2d2.serving.chat`) writes ``System:
    ...``, ``User: ...``, ``Assistant: ...`` turns ending in ``Assistant:``, so each turn's prompt starts
    with the whole previous prompt (the conversation opens with a system message: a lone user message is
    sent bare, and a bare first turn is not a prefix of the second). What turn k adopts from the cache is
    the common prefix ``L`` of its prompt and the previous request's cached positions (previous prompt +
    the ids it generated), in whole blocks of 16 (block = page here), at most what a prompt can reuse
    (:func:`_reusable`: its whole blocks): ``cached_tokens == floor16(min(L,
    _reusable(prompt)))``, measured exactly.
    The previous ANSWER is reused as far as re-encoding its text gives the generated ids again: on this
    conversation turn 2 adopts 96 positions of a 62-token previous prompt (the answer re-encodes to its
    ids), while turn 3's previous answer starts with a digit continuation (``@@0``, decoded as text
    ``@@0`` and re-read as other tokens), so turn 3 reuses only the previous prompt (128 of 135). The
    no-cache server answers the same texts with 0 cached tokens.
    """
    turns = _conversation(cached_url, 4)
    with serve_cli("--max-num-seqs", "1", "--no-prefix-cache") as url:
        plain = _conversation(url, 4)
    assert [t[1] for t in plain] == [t[1] for t in turns]  # the same answers with and without the cache
    assert all(t[3] == 0 for t in plain)
    prompts = [chat_prompt_ids(ref, [ChatMessage(**m) for m in t[0]]) for t in turns]
    assert [len(p) for p in prompts] == [t[2] for t in turns]
    answers = [ref.generate(p, max_new_tokens=MAX_TOKENS) for p in prompts]
    assert [a.text for a in answers] == [t[1] for t in turns]
    assert turns[0][3] == 0
    reused_answer = 0
    for k in range(1, 4):
        prev, prompt, cached = prompts[k - 1], prompts[k], turns[k][3]
        assert prompt[: len(prev)] == prev  # the previous prompt is a prefix of this one
        generated = [i for i in answers[k - 1].token_ids if i not in ref.info.eos_token_ids]
        common = _common(prompt, prev + generated)
        assert cached == _floor(min(common, _reusable(len(prompt))))
        assert cached >= _floor(len(prev))  # the previous prompt, in whole blocks
        reused_answer += cached > len(prev)
    assert reused_answer >= 1  # at least one previous answer came from the cache too (turn 2 here)


def test_a_bare_first_turn_is_reused_by_the_next(cached_url):
    """Under the chat fallback on tiny-gsm (whose vocabulary cannot spell role names) every turn is sent
    bare, in order: the second turn's prompt starts with the first's, so its pages are reused."""
    client, q = _client(cached_url), QUESTIONS[5]
    first = client.chat.completions.create(
        model="tiny-gsm", messages=[{"role": "user", "content": q}], max_tokens=16, temperature=0
    )
    msgs = [
        {"role": "user", "content": q},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": QUESTIONS[6]},
    ]
    second = client.chat.completions.create(model="tiny-gsm", messages=msgs, max_tokens=16, temperature=0)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // PAGE * PAGE > 0


# ---------------------------------------------------------------------------------------------- bench-serve
def test_bench_serve_shared_prefix_and_kv_metrics(cached_url, ref):
    """``bench-serve --shared-prefix N``: every prompt starts with the same N tokens; the server's cache
    serves them after the first request. /metrics then shows the KV gauges and counters: no page used
    when idle, cached pages kept, a hit rate above 0, the cached prompt tokens the answers reported."""
    from s2d2.serving.load import run_levels, shared_prefix

    n, tokens = 8, 64
    prefix = shared_prefix(tokens)
    tok = ref
    for q in QUESTIONS[:n]:  # the prefix text re-encodes to exactly N tokens, then the question's own
        assert tok.encode(prefix + q)[tokens:] == tok.encode(q)
        assert len(tok.encode(prefix)) == tokens
    before = metric(cached_url, "s2d2_cached_prompt_tokens_total")
    prompts = [len(tok.encode(prefix + q)) for q in QUESTIONS[:n]]
    (result,) = run_levels(
        cached_url, [4], n=n, max_tokens=16, shared_prefix_tokens=tokens, prompts=QUESTIONS
    )
    assert result["errors"] == 0 and result["shared_prefix"] == tokens
    assert result["ttft_ms_p50"] is not None
    assert result["prompt_tokens"] == sum(prompts)
    # all but the first request adopt the whole prefix (the others wait for it rather than compute it)
    assert result["cached_prompt_tokens"] >= (n - 1) * tokens
    _wait_idle(cached_url)
    text = httpx.get(cached_url + "/metrics").text
    for name in ("kv_pages_used", "kv_pages_free", "kv_pages_cached", "prefix_hit_rate"):
        assert f"# TYPE s2d2_{name} gauge" in text
    for name in ("preemptions_total", "kv_page_evictions_total", "cached_prompt_tokens_total"):
        assert f"# TYPE s2d2_{name} counter" in text
    assert metric(cached_url, "s2d2_kv_pages_used") == 0
    assert metric(cached_url, "s2d2_kv_pages_cached") > 0
    assert metric(cached_url, "s2d2_prefix_hit_rate") > 0
    assert metric(cached_url, "s2d2_preemptions_total") == 0  # no budget: nothing to preempt for
    assert metric(cached_url, "s2d2_cached_prompt_tokens_total") - before == result["cached_prompt_tokens"]


def test_bench_serve_shared_prefix_cli(cached_url, capsys, tmp_path):
    """The CLI: ``--json`` levels carry ``shared_prefix`` and the usage sums; the table keeps its columns."""
    args = ["bench-serve", "--url", cached_url, "--concurrency", "2", "--n", "2", "--max-tokens", "4"]
    code, out, _ = run_cli(capsys, *args, "--shared-prefix", "32", "--json")
    assert code == 0
    (level,) = json.loads(out)
    assert level["shared_prefix"] == 32 and level["errors"] == 0 and level["cached_prompt_tokens"] >= 32
    code, out, _ = run_cli(capsys, *args, "--shared-prefix", "32")
    assert code == 0 and out.splitlines()[0].split() == [
        "conc", "reqs", "errors", "tok/s", "TTFT", "p50", "ms", "TTFT", "p99", "ms", "ITL", "p50", "ms",
        "ITL", "p99", "ms",
    ]  # fmt: skip


def test_bench_serve_shared_prefix_options(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench-serve", "--shared-prefix", "-1")
    assert_one_line_error(code, err, "--shared-prefix")
    code, _, err = run_cli(capsys, "bench-serve", "--shared-prefix", "8", "--tokenizer", str(tmp_path))
    assert_one_line_error(code, err, "--tokenizer", "no tokenizer")

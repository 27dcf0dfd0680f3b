"""`s2d2 serve` on paged KV memory (issue 26): real HTTP, a real server, the official openai client.

- ``usage.prompt_tokens_details.cached_tokens`` (completions and chat, streamed with ``include_usage``);
- ``s2d2 bench-serve --shared-prefix N`` and the KV gauges and counters of ``/metrics``.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import s2d2  # noqa: E402
from conftest import assert_one_line_error, run_cli  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402
from test_server import metric, running_server  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:32]]
MAX_TOKENS = 48
PAGE = 16  # --kv-page-size (the default) and the shipped preset's block size
ROWS = 8
SYSTEM = "Answer the question."


def _floor(n: int, multiple: int = PAGE) -> int:
    return n // multiple * multiple


def _reusable(prompt_tokens: int) -> int:
    """The most positions a prompt of this length can adopt from the cache: the engine prefills the
    prompt's whole blocks (its partial last block is decoded with the answer's first one) and always
    computes the last of them again (its forward gives what comes next), in whole blocks."""
    return max(_floor(prompt_tokens) - PAGE, 0)


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


def test_bench_serve_shared_prefix_options(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench-serve", "--shared-prefix", "-1")
    assert_one_line_error(code, err, "--shared-prefix")
    code, _, err = run_cli(capsys, "bench-serve", "--shared-prefix", "8", "--tokenizer", str(tmp_path))
    assert_one_line_error(code, err, "--tokenizer", "no tokenizer")

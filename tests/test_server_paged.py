"""`s2d2 serve` on paged KV memory (issue 26): real HTTP, a real server, the official openai client.

- ``usage.prompt_tokens_details.cached_tokens`` (completions and chat, streamed with ``include_usage``);
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import s2d2  # noqa: E402
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

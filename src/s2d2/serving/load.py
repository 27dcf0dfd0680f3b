"""``s2d2 bench-serve``: a load generator for an OpenAI-compatible server (streaming requests).

At each concurrency level, ``n`` requests (the tiny-gsm test questions, in order) are sent by that many
concurrent clients over httpx; each request streams with ``stream_options.include_usage``. Per level:
aggregate output tokens/s (completion tokens of the level / its wall time), time to first token (TTFT,
to the first chunk with text), inter-token latency (ITL: the gaps between text chunks; a diffusion step
may commit several tokens at once, so one chunk can carry more than one token), p50 and p99, and errors.

With a background (``--background N``), N more clients stream long requests (``--background-s2d2``
settings, ``ignore_eos``, 256 tokens, over and over) for the whole level, started 2 s before it: the
level's figures then say what that load does to the measured clients (``s2d2 serve``'s robustness
check, BENCHMARKS.md "Server robustness").

With a shared prefix (``--shared-prefix N``), every prompt (the user message, with ``--chat``) starts
with the same N tokens: worked examples of tiny-gsm's dev split cut to N tokens
(:func:`s2d2.bench.shared_prefix.shared_prefix_text`), counted by the tokenizer of ``--tokenizer`` (the
built-in tiny-gsm model's by default, read from the installed package: nothing is fetched; a local
checkpoint directory's for another model). A server with its prefix cache on then computes the prefix
once and every later request adopts its pages: the level's TTFT shows it, and ``prompt_tokens`` /
``cached_prompt_tokens`` (the sums of the answers' ``usage.prompt_tokens`` and
``usage.prompt_tokens_details.cached_tokens``) say how much of the prompts the cache served.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import S2D2Error


@dataclass
class Sample:
    ok: bool = False
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise S2D2Error(f"--concurrency must be integers separated by commas, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise S2D2Error("--concurrency levels must be >= 1")
    return levels


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def default_prompts() -> list[str]:
    from ..tasks.tiny_gsm.splits import load_split

    return [p["question"] for p in load_split("test")]


async def _one(client: Any, url: str, body: dict[str, Any]) -> Sample:
    s, t0 = Sample(), time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                s.error = f"HTTP {resp.status_code}"
                await resp.aread()
                return s
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    s.error = data["error"].get("message", "error")
                    return s
                if data.get("usage"):
                    u = data["usage"]
                    s.tokens, s.prompt_tokens = u["completion_tokens"], u.get("prompt_tokens", 0)
                    s.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                for c in data.get("choices", []):
                    if c.get("text") or c.get("delta", {}).get("content"):
                        now = time.perf_counter()
                        if s.ttft is None:
                            s.ttft = now - t0
                        else:
                            s.gaps.append(now - last)
                        last = now
        s.ok = s.error is None
    except Exception as exc:  # a load generator reports failures, it does not stop on them
        s.error = f"{exc.__class__.__name__}: {exc}"
    return s


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(level: int, samples: list[Sample], seconds: float) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    gaps = [g for s in ok for g in s.gaps]
    ms = 1000.0

    def p(values: list[float], q: float) -> float | None:
        v = _pct(values, q)
        return None if v is None else round(v * ms, 2)

    return {
        "concurrency": level,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "seconds": round(seconds, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0,
        "ttft_ms_p50": p(ttfts, 50),
        "ttft_ms_p99": p(ttfts, 99),
        "itl_ms_p50": p(gaps, 50),
        "itl_ms_p99": p(gaps, 99),
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "cached_prompt_tokens": sum(s.cached_tokens for s in ok),
        "first_error": next((s.error for s in samples if s.error), None),
    }


#: Seconds the background load runs before a level's measured requests start.
BACKGROUND_WARMUP_S = 2.0


async def _background(client: Any, url: str, bodies: list[dict[str, Any]], stop: asyncio.Event) -> int:
    """Stream ``bodies`` one after another, round and round, until ``stop``; returns the errors seen."""
    errors, i = 0, 0
    while not stop.is_set():
        sample = await _one(client, url, bodies[i % len(bodies)])
        errors += not sample.ok
        i += 1
    return errors


async def run_level(
    url: str,
    level: int,
    bodies: list[dict[str, Any]],
    *,
    timeout: float,
    background: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """``bodies`` sent by ``level`` concurrent clients; ``background``: one body list per background
    client, streamed for the whole level (see the module docstring)."""
    import httpx

    width = level + len(background or [])
    limits = httpx.Limits(max_connections=width, max_keepalive_connections=width)
    todo = list(enumerate(bodies))
    samples: list[Sample] = [Sample()] * len(bodies)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        stop = asyncio.Event()
        loaders = [asyncio.ensure_future(_background(client, url, b, stop)) for b in background or []]
        if loaders:
            await asyncio.sleep(BACKGROUND_WARMUP_S)

        async def worker() -> None:
            while todo:
                i, body = todo.pop(0)
                samples[i] = await _one(client, url, body)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(level)))
        seconds = time.perf_counter() - t0
        stop.set()
        for task in loaders:
            task.cancel()
        await asyncio.gather(*loaders, return_exceptions=True)
    result = summarize(level, samples, seconds)
    if background:
        result["background"] = len(background)
    return result


def shared_prefix(n_tokens: int, tokenizer: str = "tiny-gsm") -> str:
    """The ``--shared-prefix`` text: ``n_tokens`` tokens of worked tiny-gsm dev examples, as counted by
    ``tokenizer`` (a built-in model's name or a local checkpoint directory; see the module docstring)."""
    if n_tokens < 0:
        raise S2D2Error(f"--shared-prefix must be >= 0, got {n_tokens}")
    if n_tokens == 0:
        return ""
    from ..bench.shared_prefix import shared_prefix_text
    from ..families.tokenizer import load_tokenizer
    from ..model_source import resolve_model_path

    tok = load_tokenizer(resolve_model_path(tokenizer))
    if tok is None:
        raise S2D2Error(f"--tokenizer {tokenizer}: no tokenizer files there")

    def encode(text: str) -> list[int]:
        return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]

    return shared_prefix_text(encode, lambda ids: tok.decode(ids, skip_special_tokens=True), n_tokens)


def request_bodies(
    n: int,
    *,
    max_tokens: int,
    chat: bool,
    extension: dict[str, Any] | None,
    prompts: list[str] | None = None,
    prefix: str = "",
) -> list[dict[str, Any]]:
    prompts = prompts or default_prompts()
    bodies = []
    for i in range(n):
        q = prefix + prompts[i % len(prompts)]
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update({"messages": [{"role": "user", "content": q}]} if chat else {"prompt": q})
        if extension:
            body["s2d2"] = extension
        bodies.append(body)
    return bodies


def run_levels(
    url: str,
    levels: list[int],
    *,
    n: int,
    max_tokens: int = 128,
    chat: bool = False,
    extension: dict[str, Any] | None = None,
    timeout: float = 120.0,
    prompts: list[str] | None = None,
    background: int = 0,
    background_extension: dict[str, Any] | None = None,
    shared_prefix_tokens: int = 0,
    tokenizer: str = "tiny-gsm",
) -> list[dict[str, Any]]:
    """One result per level (see :func:`summarize`), the levels one after another; ``background``
    clients stream ``background_extension`` requests meanwhile; every measured prompt starts with the
    same ``shared_prefix_tokens`` tokens of ``tokenizer`` (:func:`shared_prefix`; see the module
    docstring), and each level's result then says ``shared_prefix``."""
    endpoint = _base(url) + ("/chat/completions" if chat else "/completions")
    prefix = shared_prefix(shared_prefix_tokens, tokenizer)
    bodies = request_bodies(
        n, max_tokens=max_tokens, chat=chat, extension=extension, prompts=prompts, prefix=prefix
    )
    loads = None
    if background:
        ext = {**(background_extension or {}), "ignore_eos": True}
        all_bodies = request_bodies(8 * background, max_tokens=256, chat=chat, extension=ext, prompts=prompts)
        loads = [all_bodies[i::background] for i in range(background)]
    results = [
        asyncio.run(run_level(endpoint, level, bodies, timeout=timeout, background=loads)) for level in levels
    ]
    if shared_prefix_tokens:
        for r in results:
            r["shared_prefix"] = shared_prefix_tokens
    return results


def format_table(results: list[dict[str, Any]]) -> str:
    cols = [
        ("concurrency", "conc"),
        ("requests", "reqs"),
        ("errors", "errors"),
        ("output_tokens_per_s", "tok/s"),
        ("ttft_ms_p50", "TTFT p50 ms"),
        ("ttft_ms_p99", "TTFT p99 ms"),
        ("itl_ms_p50", "ITL p50 ms"),
        ("itl_ms_p99", "ITL p99 ms"),
    ]
    rows = [[h for _, h in cols]] + [["-" if r[k] is None else str(r[k]) for k, _ in cols] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)

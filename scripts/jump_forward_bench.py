"""Jump-forward on schema-constrained tool calls: NFE/token and wall time with and without it,
side by side, on the tool-call tests' random SDAR and LLaDA2 models (tests/tool_fixtures.py: byte-level
tokenizers, Hermes / LLaDA2-style templates): N prompts x 3 schemas (nested objects, arrays, enums),
``tool_choice`` required (one call), through the server's request path; the tokens must be identical
(and equal constrained AR greedy's under the lossless presets). Rows: constrained AR (``ar``), the
lossless presets and the model's default settings.

    PYTHONPATH=src python scripts/jump_forward_bench.py [N]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]

import s2d2  # noqa: E402
from s2d2.serving.prepare import prepare  # noqa: E402
from s2d2.serving.protocol import ChatCompletionRequest  # noqa: E402
from structured_fixtures import SCHEMAS  # noqa: E402
from tool_fixtures import make_llada2_tool_model, make_sdar_tool_model  # noqa: E402

NAMES = ("nested", "array", "enum")


def requests(model, n: int, settings: dict) -> list:
    out = []
    for name in NAMES:
        tool = {"type": "function", "function": {"name": f"use_{name}", "parameters": SCHEMAS[name]}}
        for i in range(n):
            body = {
                "messages": [{"role": "user", "content": f"item {i}: {'ab' * (i % 5)} {i * 7 % 13}"}],
                "tools": [tool],
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "max_tokens": 120,
                "s2d2": settings,
            }
            out.append(prepare(model, ChatCompletionRequest.model_validate(body), served_name=model.name))
    return out


def run(model, preps) -> tuple[list, float, float]:
    t = time.perf_counter()
    outs = model.engine.generate(
        [p.prompt_ids for p in preps], [p.config for p in preps], constraints=[p.constraint for p in preps]
    )
    sec = time.perf_counter() - t
    tokens = sum(len(o.token_ids) for o in outs)
    return [o.token_ids for o in outs], sum(o.stats.nfe for o in outs) / max(tokens, 1), tokens / sec


def main(n: int) -> None:
    for make in (make_sdar_tool_model, make_llada2_tool_model):
        bench(make, n)


def bench(make, n: int) -> None:
    path = make(Path(tempfile.mkdtemp()) / "model")
    model = s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=16)
    run(model, requests(model, 2, {}))  # warm up
    ar_settings = {"decoder": "ar", "causal_cache": True}
    ar, _, _ = run(model, requests(model, n, {**ar_settings, "jump_forward": False}))
    print(f"{model.info.family}: {3 * n} calls; block size {model.info.default_block_size}")
    for preset in ("ar", "lossless", "lossless-fused", "lossless-auto", None):
        base = ar_settings if preset == "ar" else {"preset": preset} if preset else {}
        on = run(model, requests(model, n, {**base, "jump_forward": True}))
        off = run(model, requests(model, n, {**base, "jump_forward": False}))
        same = sum(a == b for a, b in zip(on[0], off[0], strict=True))
        eq_ar = sum(a == b for a, b in zip(on[0], ar, strict=True))
        print(
            f"{preset or 'default':15s} nfe/tok off {off[1]:.3f} on {on[1]:.3f}  tok/s off {off[2]:.1f} "
            f"on {on[2]:.1f}  identical {same}/{len(ar)}  ==AR {eq_ar}/{len(ar)}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)

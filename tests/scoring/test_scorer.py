"""AR-mode likelihoods: ``s2d2.scoring.scorer`` and ``model.score`` / ``loglikelihood`` / ``_rolling``.

References: the SDAR golden 2L logits on a token-causal cache (rows 4..7 of ``verify2L_logits_cachever`` are
the AR logits of the draft-filled block), and everywhere a token-by-token recompute through transformers'
own forward with its own causal mask (same-position families: the prefix then a MASK at the scored
position, one forward per token; shifted: one causal forward, row i-1 scores token i).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, load_or_skip
from s2d2.errors import ConfigError, PromptError
from s2d2.families.base import ModelAdapter
from s2d2.scoring.scorer import Scorer, TokenScores, rolling_windows

ATOL = 1e-4
PROMPT = [17, 42, 101, 7, 250, 3, 88, 199]
FILLED = [311, 123, 45, 64]
FAMILIES = ["tiny-gsm", "sdar", "sdar_moe", "fast_dllm_v2", "llada2"]


def load_family(name: str):
    import s2d2

    if name == "tiny-gsm":
        return s2d2.load("tiny-gsm", device="cpu", dtype="fp32")
    if name == "sdar_moe":  # written by the tests
        return load_or_skip("sdar_moe")
    if not (FIXTURES / name).is_dir():
        pytest.skip(f"conformance fixtures not found at {FIXTURES / name}")
    return s2d2.load(FIXTURES / name, device="cpu", dtype="fp32")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_family(request.param)


def reference(
    adapter, context: list[int], continuation: list[int], at: list[int] | None = None
) -> torch.Tensor:
    """Per-token AR log-probabilities of ``continuation`` (of its tokens ``at``, default all) through
    transformers' own forward."""
    seq, at = context + continuation, list(range(len(continuation))) if at is None else at
    with torch.inference_mode():
        if adapter.info.shifted:
            logits = adapter.model(input_ids=torch.tensor([seq[:-1]])).logits[0, len(context) - 1 :][at]
        else:
            mask = adapter.info.mask_token_id
            logits = torch.stack(
                [
                    adapter.model(input_ids=torch.tensor([seq[: len(context) + i] + [mask]])).logits[0, -1]
                    for i in at
                ]
            )
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(1, torch.tensor(continuation)[at][:, None])[:, 0]


def requests_for(info, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """The golden prompt/block, then random contexts each with two continuations (a shared context)."""
    g = torch.Generator().manual_seed(seed)
    low, high = 5, info.vocab_size

    def draw(n_max: int) -> list[int]:
        ids = torch.randint(low, high, (int(torch.randint(1, n_max, (1,), generator=g)),), generator=g)
        return [t if t != info.mask_token_id else t - 1 for t in ids.tolist()]

    reqs = [([t % high for t in PROMPT], [t % high for t in FILLED])]
    for _ in range(4):
        ctx = draw(24)
        reqs += [(ctx, draw(10)), (ctx, draw(6))]
    if not info.shifted:  # a same-position model scores a first token too (a MASK at position 0)
        reqs.append(([], draw(6)))
    return reqs


def max_diff(a: list[TokenScores], b: list[TokenScores]) -> float:
    pairs = [(x, y) for s, t in zip(a, b, strict=True) for x, y in zip(s.logprobs, t.logprobs, strict=True)]
    return max(abs(x - y) for x, y in pairs)


# ---------------------------------------------------------------------------------------------- exactness
def test_score_equals_the_reference_ar_forward(model):
    reqs = requests_for(model.info)
    scores = model.score(reqs)
    for s, (ctx, cont) in zip(scores, reqs, strict=True):
        ref = reference(model.adapter, ctx, cont)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=ATOL, rtol=0)
        assert abs(s.total - float(ref.sum())) < ATOL * len(cont)
        assert len(s.greedy) == len(cont) and s.top is None


def test_sdar_score_equals_the_golden_2l_logits():
    model = load_family("sdar")
    golden = load_file(str(FIXTURES / "sdar" / "golden.safetensors"))["verify2L_logits_cachever"][4:8]
    logprobs = torch.log_softmax(golden, dim=-1)
    [s] = model.score([(PROMPT, FILLED)], top_logprobs=5)
    torch.testing.assert_close(torch.tensor(s.logprobs), logprobs[torch.arange(4), FILLED], atol=ATOL, rtol=0)
    assert s.greedy == (logprobs.argmax(-1) == torch.tensor(FILLED)).tolist()
    values, ids = logprobs.topk(5, dim=-1)
    assert [[t for t, _ in row] for row in s.top] == ids.tolist()
    torch.testing.assert_close(
        torch.tensor([[v for _, v in row] for row in s.top]), values, atol=ATOL, rtol=0
    )


def test_batched_equals_alone_chunked_and_transformers_path(model):
    reqs = requests_for(model.info, seed=1)
    batched = model.score(reqs)
    alone = [model.score([r])[0] for r in reqs]
    assert max_diff(batched, alone) < ATOL  # float32 rounding of differently packed forwards
    assert [s.greedy for s in batched] == [s.greedy for s in alone]
    tiny_pieces = Scorer(model.adapter, chunk_tokens=5, batch_tokens=9, max_rows=2).score(reqs)
    assert max_diff(batched, tiny_pieces) < ATOL
    fast, model.adapter.fast = model.adapter.fast, None
    try:
        native = Scorer(model.adapter).score(reqs)
    finally:
        model.adapter.fast = fast
    assert max_diff(batched, native) < ATOL


def test_loglikelihood_of_text_is_the_reference_sum():
    model = load_family("tiny-gsm")
    problems = tiny_problems()[:3]
    own = model.generate(problems[0]["question"], preset="lossless", max_new_tokens=64).text
    pairs = [(problems[0]["question"], " " + own)]  # the model's own lossless (= greedy AR) answer
    pairs += [(p["question"], " " + p["answer"]) for p in problems]
    pairs += [(p["question"] + " ", "#### 12345") for p in problems[:1]]  # the trailing space moves
    results = model.loglikelihood(pairs)
    for (total, greedy), (context, continuation) in zip(results, pairs, strict=True):
        ctx, cont = model.encode_pair(context, continuation)
        assert ctx == model.encode(context.rstrip())
        assert ctx + cont == model.encode(context + continuation)
        ref = reference(model.adapter, ctx, cont)
        assert abs(total - float(ref.sum())) < ATOL * len(cont)
        [s] = model.score([(ctx, cont)])
        assert greedy == all(s.greedy)
    assert results[0][1] is True
    assert results[-1][1] is False
    # an empty context is the prefix token (BOS), as in lm-eval's HF model
    ((total, _),) = model.loglikelihood([("", "Ben has 3 apples .")])
    ref = reference(model.adapter, [model.info.bos_token_id], model.encode("Ben has 3 apples ."))
    assert abs(total - float(ref.sum())) < 1e-3


def test_loglikelihood_rolling_windows_a_long_text():
    model = load_family("tiny-gsm")
    problems = tiny_problems()[:12]
    text = " ".join(p["question"] + " " + p["answer"] for p in problems)
    ids = model.encode(text)
    window = model.info.max_length - 1  # a same-position model reads the last token at its own position
    assert len(ids) > window
    windows = model.rolling_requests(text)
    assert [len(c) + len(x) for c, x in windows][0] == window + 1 and sum(len(x) for _, x in windows) == len(
        ids
    )
    [total] = model.loglikelihood_rolling([text])
    scores = model.score(windows)
    assert abs(total - sum(s.total for s in scores)) < 1e-6
    for s, (c, x) in zip(scores, windows, strict=True):  # spot checks: the reference is one forward a token
        at = sorted({0, 1, len(x) // 2, len(x) - 1})
        torch.testing.assert_close(
            torch.tensor(s.logprobs)[at], reference(model.adapter, c, x, at), atol=ATOL, rtol=0
        )
    assert model.loglikelihood_rolling([""]) == [0.0]


def test_rolling_windows_are_lm_evals():
    utils = pytest.importorskip("lm_eval.utils")
    for n in (0, 1, 5, 9, 10, 11, 31):
        for window in (1, 3, 10):
            tokens = list(range(100, 100 + n))
            ref = [
                utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(tokens, 7, window, 1)
            ]
            assert rolling_windows(tokens, 7, window) == [(list(c), list(x)) for c, x in ref]


def test_the_engines_verified_logprobs_are_the_scorers(model):
    """A lossless request's tokens are all AR-verified; their logprobs are what ``score`` says."""
    info = model.info
    prompts = [[t % info.vocab_size for t in PROMPT[:k]] for k in (3, 8)]
    if model.tokenizer is not None:
        prompts = [model.encode(q["question"]) for q in tiny_problems()[:3]]
    cfg = model.make_config(preset="lossless", block_size=8, max_new_tokens=24, logprobs=2)
    for prompt, out in zip(prompts, model.engine.generate(prompts, [cfg] * len(prompts)), strict=True):
        [s] = model.score([(prompt, out.token_ids)], top_logprobs=2)
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        assert {lp.source.value for lp in out.logprobs} == {"ar"}
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(got, torch.tensor(s.logprobs), atol=ATOL, rtol=0)
        top = torch.tensor([[v for _, v in lp.top] for lp in out.logprobs])  # values: robust to near-ties
        torch.testing.assert_close(
            top, torch.tensor([[v for _, v in row] for row in s.top]), atol=ATOL, rtol=0
        )


# ---------------------------------------------------------------------------------------------- batching
class CountingAdapter:
    """Wraps an adapter and records each forward's segments."""

    def __init__(self, adapter):
        self.inner, self.calls = adapter, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, segments):
        self.calls.append([(s.state, s.n, s.keep) for s in segments])
        return self.inner.run(segments)

    def run_and_keep(self, segments):  # the scorer's entry: pages, this forward, then the rows keep
        return ModelAdapter.run_and_keep(self, segments)


def test_a_shared_context_is_fed_once_and_rows_are_batched():
    model = load_family("tiny-gsm")
    spy = CountingAdapter(model.adapter)
    ctx = model.encode("Ben has 3 apples . He buys 2 more . How many apples does he have ?")
    choices = [model.encode(f"#### {n}") for n in (5, 6, 15, 50)]
    other = model.encode("Lily has 4 books .")
    scores = Scorer(spy).score([(ctx, c) for c in choices] + [(other, choices[0])])
    assert len(spy.calls) == 1 and len(spy.calls[0]) == 2  # two rows (contexts) in one forward
    (_, n, keep), _ = spy.calls[0]
    assert keep == len(ctx) and n == len(ctx) + sum(2 * len(c) - 1 for c in choices)
    assert max_diff(scores[:4], model.score([(ctx, c) for c in choices])) < ATOL
    narrow = CountingAdapter(model.adapter)  # a key/value budget below two rows: one row a forward
    alone = Scorer(narrow, kv_tokens=1).score([(ctx, c) for c in choices] + [(other, choices[0])])
    assert [len(call) for call in narrow.calls] == [1, 1] and max_diff(alone, scores) < ATOL


def test_scoring_leaves_the_engine_alone():
    model = load_family("tiny-gsm")
    prompt = "Ben has 3 apples . He buys 2 more . How many apples does he have ?"
    first = model.generate(prompt, preset="lossless", max_new_tokens=24)
    spy = CountingAdapter(model.adapter)
    model._scorer = Scorer(spy)
    try:
        [s] = model.score([(model.encode(prompt), first.token_ids)])
    finally:
        model._scorer = None
    pools = {id(state.cache) for call in spy.calls for state, _, _ in call}
    assert id(model.engine.pool) not in pools and model.engine.pool.rows_in_use == 0
    assert model.generate(prompt, preset="lossless", max_new_tokens=24).token_ids == first.token_ids
    # the lossless answer is the AR mode's greedy continuation, and the scorer says so
    assert all(s.greedy)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "requests, match",
    [
        ([([1, 2], [400])], r"token ids must lie in \[0, 320\)"),
        ([([5, 2], [7])], "mask token"),
        ([([5] * 600, [7])], "too long: 601 tokens"),
        ([(5, [7])], "pair of token-id sequences"),
        ([([5],)], "pair of token-id sequences"),
    ],
)
def test_bad_requests_are_one_line_errors(requests, match):
    model = load_family("tiny-gsm")
    with pytest.raises(PromptError, match=match) as info:
        model.score(requests)
    assert len(str(info.value).splitlines()) == 1


def test_bad_top_logprobs_and_shifted_empty_context():
    model = load_family("tiny-gsm")
    for bad in (-1, 321, 1.5, True):
        with pytest.raises(ConfigError, match="top_logprobs"):
            model.score([([5], [7])], top_logprobs=bad)
    assert model.score([([5], [])])[0].logprobs == [] and model.score([])[0:] == []
    shifted = load_family("fast_dllm_v2")
    with pytest.raises(PromptError, match="context is empty"):
        shifted.score([([], [7])])


def tiny_problems() -> list[dict]:
    from s2d2.tasks.tiny_gsm.splits import load_split

    return load_split("test", 20)

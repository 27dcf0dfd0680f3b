"""Tensor parallel = 2 (two processes on the CPU, gloo) decodes the same tokens as one process.

The built-in tiny-gsm model (4 heads, 4 KV heads) loaded once alone and once over two ranks (the second
rank a spawned process holding half of every split weight); 48 test problems decoded in batches of 16
rows under each configuration: AR, lossless (verified apart and fused), lossless-auto (the planner), a
routed s2d2 configuration (score routing) and dynamic decoding. Then lossless == AR under TP=2,
batch == alone under TP=2, and which steps read the rows' summaries rather than gathered logits.
"""

from __future__ import annotations

import pytest

import s2d2
from conftest import tiny_model_path
from s2d2.bench.suites import load_problems

pytestmark = pytest.mark.tensor_parallel

N_PROBLEMS = 48
ROWS = 16
NEW = 24
CONFIGS = {
    "ar": dict(decoder="ar"),
    "lossless": dict(preset="lossless", block_size=8),
    "lossless-fused": dict(preset="lossless-fused", block_size=8),
    "lossless-auto": dict(preset="lossless-auto"),
    "routed": dict(preset="paper-sdar-a"),
    "dynamic": dict(decoder="dynamic", block_size=4, threshold=0.9),
}


def _load(tp: int):
    if tiny_model_path() is None:
        pytest.skip("the built-in tiny-gsm model is not installed")
    return s2d2.load("tiny-gsm", device="cpu", dtype="fp32", max_num_seqs=ROWS, tensor_parallel_size=tp)


@pytest.fixture(scope="module")
def one():
    return _load(1)


@pytest.fixture(scope="module")
def two():
    model = _load(2)
    yield model
    model.adapter.ranks.close()


@pytest.fixture(scope="module")
def prompts(one):
    return [one.encode(p["question"]) for p in load_problems("tiny-gsm", "test", N_PROBLEMS)]


def _tokens(model, prompts, **cfg) -> list[list[int]]:
    return [r.token_ids for r in model.generate_batch(prompts, max_new_tokens=NEW, **cfg)]


@pytest.fixture(scope="module")
def decoded_two(two, prompts):
    return {name: _tokens(two, prompts, **cfg) for name, cfg in CONFIGS.items()}


def test_each_rank_holds_half_of_the_weights(one, two):
    total = sum(p.numel() * p.element_size() for p in one.adapter.model.parameters())
    per_rank = two.adapter.ranks.param_bytes
    assert len(per_rank) == 2
    # every weight of this model is split (norms are replicated: a few hundred bytes a layer)
    assert all(b <= total / 2 + 16 * 1024 for b in per_rank), (per_rank, total)
    assert sum(per_rank) >= total


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tp2_decodes_the_same_tokens_as_tp1(one, prompts, decoded_two, name):
    assert len(decoded_two[name]) == N_PROBLEMS and all(decoded_two[name])
    assert decoded_two[name] == _tokens(one, prompts, **CONFIGS[name])


def test_lossless_equals_ar_under_tp2(decoded_two):
    for name in ("lossless", "lossless-fused", "lossless-auto"):
        assert decoded_two[name] == decoded_two["ar"], name


def test_batch_equals_alone_under_tp2(two, prompts, decoded_two):
    for i in (0, 17, 40):
        for name in ("routed", "lossless-fused"):
            assert _tokens(two, [prompts[i]], **CONFIGS[name])[0] == decoded_two[name][i], (i, name)


def test_tp2_under_a_kv_budget_that_preempts_decodes_as_tp1(prompts):
    """Rows preempted and resumed (their pages given back and retaken, prefix pages shared): every rank
    follows rank 0's page tables, so the tokens stay those of one process under the same budget."""
    budget = dict(device="cpu", dtype="fp32", max_num_seqs=ROWS, kv_budget_tokens=384)
    one = s2d2.load("tiny-gsm", **budget)
    two = s2d2.load("tiny-gsm", **budget, tensor_parallel_size=2)
    try:
        cfg = CONFIGS["lossless-fused"]
        want = _tokens(one, prompts[:32], **cfg)
        assert one.engine.stats()["preemptions"] > 0
        got = _tokens(two, prompts[:32], **cfg)
        assert two.engine.stats()["preemptions"] > 0
        assert got == want
    finally:
        two.adapter.ranks.close()


def test_a_growing_pool_grows_on_every_rank(one, two):
    """An unbounded pool doubles as rows take pages on rank 0; each forward's message carries its size and
    the other ranks grow theirs to match before writing (logits equal to one process's after growing)."""
    import torch

    ids = torch.arange(300) % 200 + 20
    block = torch.tensor([5, one.adapter.info.mask_token_id, 7, one.adapter.info.mask_token_id])
    out = []
    for model in (one, two):
        pool = model.adapter.new_pool(page_size=4)
        pages = pool.pages.num_pages
        state = pool.new_state()
        model.adapter.prefill(state, ids, block_size=4, causal=False)
        assert pool.pages.num_pages > pages
        out.append(model.adapter.draft(state, ids[:0], block, start=300, block_size=4, causal=False))
    torch.testing.assert_close(out[1], out[0], atol=1e-4, rtol=0)


def test_one_message_a_forward(two, prompts, monkeypatch):
    """Each engine forward reaches the other rank as exactly one message: the batch description."""
    tp, sent = two.adapter.tp, []
    _tokens(two, prompts[:1], **CONFIGS["ar"])  # the engine and its pool (a message of its own) exist
    send = tp.send
    monkeypatch.setattr(tp, "send", lambda message: (sent.append(message[0]), send(message))[1])
    before = two.engine.stats()["forwards"]
    _tokens(two, prompts[:16], **CONFIGS["lossless-fused"])
    forwards = two.engine.stats()["forwards"] - before
    assert forwards > 0 and sent.count("batch") == forwards and set(sent) == {"batch"}


def test_greedy_steps_gather_summaries_not_logits(two, prompts):
    """Every configuration above reads only the rows' summaries: no full-vocabulary logits reach rank 0
    (a few values a row do), and the tokens are those of one process (the tests above)."""
    tp = two.adapter.tp
    for name, cfg in CONFIGS.items():
        logits, summaries = tp.logit_values, tp.summary_values
        _tokens(two, prompts[:16], **cfg)
        assert tp.logit_values == logits, name
        assert tp.summary_values > summaries, name


@pytest.mark.parametrize(
    "cfg, summarized",
    [
        (dict(preset="lossless", block_size=8, top_k=5), False),
        (dict(preset="lossless", temperature=0.8, seed=3), False),
    ],
    ids=["greedy-top-k", "sampled"],
)
def test_steps_that_need_whole_rows_gather_them_and_decode_as_tp1(one, two, prompts, cfg, summarized):
    """A greedy row with a sampling filter (its probabilities change) and sampled rows: their traits say
    so at admission, so the forward gives the logits at once (never summaries, then the logits in a
    second message), and they decode the tokens of one process."""
    tp = two.adapter.tp
    before, summaries = tp.logit_values, tp.summary_values
    got = _tokens(two, prompts[:16], **cfg)
    assert tp.logit_values > before
    assert (tp.summary_values > summaries) == summarized
    assert got == _tokens(one, prompts[:16], **cfg)

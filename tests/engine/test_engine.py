"""Engine behaviour: prompt/block alignment, stopping, lengths, statistics, determinism, decoders."""

from __future__ import annotations

import pytest
import torch

from s2d2 import DecodeConfig
from s2d2.engine.llm_engine import decode
from s2d2.layouts import family


def _ids(tokens):
    return tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)


class Spy:
    """Records every segment the engine lays out for ``adapter``'s rows (one per row and forward), from
    the layouts the runner asks :mod:`s2d2.layouts.family` for."""

    def __init__(self, adapter, monkeypatch):
        self.adapter = adapter
        self.info = adapter.info
        self.calls: list[tuple] = []
        prefill, draft, verify = family.prefill, family.draft, family.verify

        def prefill_spy(t, length, ids, **kw):
            self.calls.append(("prefill", ids.tolist(), length))
            return prefill(t, length, ids, **kw)

        def draft_spy(t, length, pending, block, **kw):
            self.calls.append(("draft", _ids(pending), _ids(block), kw["start"], length))
            return draft(t, length, pending, block, **kw)

        def verify_spy(t, length, filled, **kw):
            self.calls.append(("verify", list(filled), kw["slots"]))
            return verify(t, length, filled, **kw)

        for name, spy in (("prefill", prefill_spy), ("draft", draft_spy), ("verify", verify_spy)):
            monkeypatch.setattr(family, name, spy)


def test_prompt_not_multiple_of_block(random_sdar, monkeypatch):
    """The prompt's whole blocks ride in the first draft forward (written to the cache there, no prefill
    forward of their own); its remainder is committed context of the first block."""
    spy = Spy(random_sdar.adapter, monkeypatch)
    M = spy.info.mask_token_id
    prompt = list(range(10))  # 10 = 2 blocks of 4 + 2
    out = decode(
        random_sdar.adapter,
        prompt,
        DecodeConfig.build(decoder="static", block_size=4, steps=4, max_new_tokens=6, ignore_eos=True),
    )
    first = spy.calls[0]
    assert first[0] == "draft" and first[1] == list(range(8)) and first[3] == 8 and first[4] == 0
    assert first[2] == [8, 9, M, M]
    assert spy.calls[1][1] == [] and spy.calls[1][4] == 8  # the prompt blocks are cached now
    # the first block's 2 masked positions take 2 steps; then the next block folds the commit of block 1
    nxt = [c for c in spy.calls if c[0] == "draft" and c[3] == 12][0]
    assert nxt[1] == [8, 9] + out.token_ids[:2] and nxt[4] == 8
    assert out.stats.generated_tokens == 6
    assert out.stats.nfe_prefill == 0 and out.stats.nfe_commit == 0


def test_long_prompts_prefill_in_chunks_then_fold(random_sdar, monkeypatch):
    """Past ``prefill_chunk`` positions the prompt is prefilled in whole-block chunks; the rest folds."""
    from s2d2.engine.llm_engine import LLMEngine

    spy = Spy(random_sdar.adapter, monkeypatch)
    prompt = list(range(1, 31))  # AR: block size 1, so all 30 positions are whole blocks
    cfg = DecodeConfig.build(decoder="ar", max_new_tokens=3, ignore_eos=True)
    out = LLMEngine(random_sdar.adapter, max_num_seqs=1, prefill_chunk=10).generate([prompt], [cfg])[0]
    prefills = [c for c in spy.calls if c[0] == "prefill"]
    assert [(len(c[1]), c[2]) for c in prefills] == [(10, 0), (10, 10)]  # B=1: chunks of 10
    assert spy.calls[2][0] == "draft" and len(spy.calls[2][1]) == 10 and spy.calls[2][4] == 20
    assert out.stats.nfe_prefill == 2
    assert out.token_ids == random_sdar.generate(prompt, **cfg.to_dict()).token_ids


def test_prompt_remainder_lossless(random_sdar):
    prompt = [3, 5, 7, 11, 13, 17, 19]
    ar = random_sdar.generate(prompt, decoder="ar", max_new_tokens=9, ignore_eos=True)
    for b in (2, 4, 8):
        s = random_sdar.generate(prompt, preset="lossless", block_size=b, max_new_tokens=9, ignore_eos=True)
        assert s.token_ids == ar.token_ids


def test_ar_costs_one_forward_per_token(random_sdar):
    out = random_sdar.generate([1, 2, 3], decoder="ar", max_new_tokens=7, ignore_eos=True)
    s = out.stats
    assert s.generated_tokens == 7 and s.nfe_draft == 7 and s.nfe_prefill == 0 and s.nfe_verify == 0
    assert s.nfe == 7  # the prompt rides in the first draft forward


@pytest.mark.parametrize("decoder", ["static", "dynamic", "eb", "s2d2"])
def test_max_new_tokens_respected(random_sdar, decoder):
    for n in (1, 3, 5, 9):
        out = random_sdar.generate(
            [1, 2, 3, 4, 5], decoder=decoder, block_size=4, max_new_tokens=n, ignore_eos=True
        )
        assert len(out.token_ids) == n and out.stats.finish_reason == "length"


def test_stop_token_trims_output(random_sdar):
    base = random_sdar.generate([4, 8, 15, 16], decoder="ar", max_new_tokens=12, ignore_eos=True)
    stop = base.token_ids[3]
    first = base.token_ids.index(stop)
    for cfg in (
        dict(decoder="ar"),
        dict(preset="lossless", block_size=4),
        dict(preset="lossless", block_size=8),
    ):
        out = random_sdar.generate(
            [4, 8, 15, 16], max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop], **cfg
        )
        assert out.token_ids == base.token_ids[: first + 1]
        assert out.stats.finish_reason == "stop"
        assert out.stats.generated_tokens == first + 1


def test_static_commits_quota_per_step(random_sdar):
    for steps, expect_steps in ((4, 4), (2, 2), (1, 1)):
        cfg = DecodeConfig.build(
            decoder="static", block_size=4, steps=steps, max_new_tokens=8, ignore_eos=True
        )
        out = decode(random_sdar.adapter, [1, 2, 3, 4], cfg)
        assert out.stats.nfe_draft == 2 * expect_steps  # two blocks


def test_trace_records_every_commit(random_sdar):
    out = random_sdar.generate(
        [1, 2, 3, 4],
        decoder="s2d2",
        policy="ucb",
        block_size=4,
        max_new_tokens=12,
        ignore_eos=True,
        trace=True,
        temperature=0.7,
        seed=3,
    )
    committed = {}
    for step in out.trace:
        for pos, tok, how in step.commits:
            assert how in {"accepted", "resampled", "fallback"}
            committed[pos] = tok
    assert [committed[4 + i] for i in range(12)] == out.token_ids
    assert sum(s.verified for s in out.trace) == out.stats.verify_steps
    full = sum(s.verified and s.accepted == s.span for s in out.trace)
    assert full == out.stats.full_accepts and full < out.stats.verify_steps


def test_seed_determinism_and_sampling(random_sdar):
    kw = dict(
        decoder="s2d2",
        block_size=4,
        max_new_tokens=16,
        ignore_eos=True,
        temperature=1.0,
        top_k=10,
        acceptance="probabilistic",
    )
    a = random_sdar.generate([1, 2, 3], seed=5, **kw)
    b = random_sdar.generate([1, 2, 3], seed=5, **kw)
    outs = {tuple(random_sdar.generate([1, 2, 3], seed=s, **kw).token_ids) for s in range(6)}
    assert a.token_ids == b.token_ids
    assert len(outs) > 1


def test_never_policy_equals_baseline(random_sdar):
    for rule in ("static", "dynamic", "eb"):
        base = random_sdar.generate(
            [9, 8, 7], decoder=rule, block_size=8, threshold=0.3, max_new_tokens=16, ignore_eos=True
        )
        s2d2 = random_sdar.generate(
            [9, 8, 7],
            decoder="s2d2",
            policy="never",
            fallback=rule,
            block_size=8,
            threshold=0.3,
            max_new_tokens=16,
            ignore_eos=True,
        )
        assert base.token_ids == s2d2.token_ids and base.stats.nfe == s2d2.stats.nfe
        assert s2d2.stats.verify_steps == 0


def test_always_verify_fewer_forwards_than_steps_times_two(random_sdar):
    out = random_sdar.generate(
        [1, 2, 3, 4], preset="lossless", block_size=8, max_new_tokens=16, ignore_eos=True
    )
    s = out.stats
    assert s.nfe_verify == s.nfe_draft
    # each step commits at least one token
    assert s.steps <= s.generated_tokens


def test_sub_blocks_restrict_candidates(random_sdar, monkeypatch):
    spy = Spy(random_sdar.adapter, monkeypatch)
    cfg = DecodeConfig.build(
        decoder="dynamic", block_size=8, sub_block_size=4, threshold=0.01, max_new_tokens=8, ignore_eos=True
    )
    decode(random_sdar.adapter, [1, 2, 3, 4, 5, 6, 7, 8], cfg)
    M = spy.info.mask_token_id
    drafts = [c for c in spy.calls if c[0] == "draft"]
    # tau tiny -> each sub-block is committed in one step: 2 drafts, the second sees sub-block 1 done
    assert len(drafts) == 2
    assert drafts[1][2][:4].count(M) == 0 and drafts[1][2][4:] == [M] * 4


def test_editing_replaces_confidently_changed_tokens(random_sdar):
    out = random_sdar.generate(
        [1, 2, 3, 4],
        decoder="static",
        block_size=8,
        steps=8,
        max_new_tokens=16,
        ignore_eos=True,
        editing_threshold=0.05,
        post_steps=2,
        trace=True,
    )
    edited = [c for s in out.trace for c in s.commits if c[2] == "edited"]
    assert out.stats.edits == len(edited)
    final = {pos: tok for s in out.trace for pos, tok, _ in s.commits}
    assert [final[4 + i] for i in range(16)] == out.token_ids


def test_batching_state_is_per_row(random_sdar):
    """Two interleaved generations do not share state (policy, cache, generator)."""
    a1 = random_sdar.generate([1, 2], decoder="s2d2", policy="hysteresis", max_new_tokens=10, ignore_eos=True)
    random_sdar.generate([5, 6, 7], decoder="s2d2", policy="ucb", max_new_tokens=10, ignore_eos=True)
    a2 = random_sdar.generate([1, 2], decoder="s2d2", policy="hysteresis", max_new_tokens=10, ignore_eos=True)
    assert a1.token_ids == a2.token_ids


def test_model_info_defaults(sdar_fixture):
    assert sdar_fixture.info.mask_token_id == 509
    assert sdar_fixture.default_config().block_size == 4
    out = sdar_fixture.generate(torch.tensor([17, 42, 101]), max_new_tokens=5, ignore_eos=True)
    assert len(out.token_ids) == 5


def test_mask_token_is_never_generated(random_sdar):
    """A model that predicts its own mask token must not stall decoding: the mask id is never committed."""
    adapter = random_sdar.adapter
    M = adapter.info.mask_token_id

    class LovesMask:  # the adapter's protocol, every forward through run
        info, device, caches_partial_blocks = adapter.info, adapter.device, adapter.caches_partial_blocks
        new_pool, prepare, can_fold_prefill = adapter.new_pool, adapter.prepare, adapter.can_fold_prefill

        def run(self, segments):
            out = [lg.clone() for lg in adapter.run(segments)]
            for lg in out:
                lg[:, M] = 1e4
            return out

    for kw in (
        dict(decoder="ar"),
        dict(decoder="dynamic", block_size=4),
        dict(preset="lossless", block_size=4),
        dict(decoder="s2d2", block_size=4, temperature=1.0, acceptance="probabilistic", seed=0),
    ):
        out = decode(
            LovesMask(), [1, 2, 3], DecodeConfig.build(max_new_tokens=9, ignore_eos=True, **kw)
        )
        assert len(out.token_ids) == 9 and M not in out.token_ids

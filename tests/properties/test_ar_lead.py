"""The AR-mode lead of a draft forward (``plan=auto`` rows): the draft forward also carries the AR query
of the block's first masked slot, so that slot's token (AR greedy's) is committed with the draft and a
request's first token comes with its first forward after the prompt.

Checked: the lead row's logits are the 2L verification's for that slot and the block's draft rows are
unchanged by it (adapters of the same-position families); in the engine, ``lossless-auto`` still gives AR
greedy's tokens, commits a first token after its first forward where ``plan=fixed`` needs two, and
feeds fewer forwards; the shifted family never gets a lead.
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import load_or_skip
from s2d2.engine.llm_engine import LLMEngine
from s2d2.forward.segment import Segment
from s2d2.layouts import family

#: the lead is the per-step planner's: planned whatever the load (the choice by load is test_plan_regime's)
pytestmark = pytest.mark.usefixtures("step_by_step_planning")


@pytest.fixture(scope="module", params=["tiny-gsm", "sdar", "sdar_moe", "llada2"])
def model(request):
    return load_or_skip(request.param)


def _prompt(model, extra: int = 0) -> list[int]:
    """21 + ``extra`` token ids: text for the built-in model, random ids for the fixtures (no tokenizer)."""
    if model.tokenizer is not None:
        ids = model.encode("Tom has 3 apples and buys 4 more. How many apples does he have?") * 3
    else:
        rng = random.Random(7)
        avoid = {model.info.mask_token_id, *model.info.eos_token_ids}
        ids = [t for t in (rng.randrange(3, model.info.vocab_size) for _ in range(64)) if t not in avoid]
    return ids[: 21 + extra]


def _block_after(model, prompt: list[int], B: int, committed: int):
    """A row whose cache holds ``prompt``'s whole blocks, its open block (the prompt's tail, ``committed``
    more slots filled by AR-looking tokens, then masks) and the pending tail tokens."""
    ad = model.adapter
    mask = model.info.mask_token_id
    start = len(prompt) // B * B
    state = ad.new_state()
    ad.prefill(state, torch.tensor(prompt[:start]), block_size=B, causal=True)
    tail = prompt[start:]
    filler = prompt[:committed]
    block = tail + filler + [mask] * (B - len(tail) - len(filler))
    return state, start, block


@pytest.mark.parametrize("committed", [0, 2])
def test_the_lead_row_is_the_verification_of_the_first_masked_slot(model, committed):
    """Lead logits == the 2L verification's for that slot; the draft rows are those of a draft without it."""
    B = 8
    ad = model.adapter
    if not ad.supports_lead(True):
        pytest.skip(f"the {model.info.family} adapter has no lead")
    prompt = _prompt(model)
    state, start, block = _block_after(model, prompt, B, committed)
    lead = block.index(model.info.mask_token_id)
    n = len(block)

    def draft(with_lead: bool) -> torch.Tensor:
        st = ad.new_state()
        ad.prefill(st, torch.tensor(prompt[:start]), block_size=B, causal=True)
        lay = family.draft(ad.info, st.length, [], block, start=start, block_size=B, causal=True,
                           lead=lead if with_lead else None)  # fmt: skip
        seg = Segment.of(st, lay)
        return ad.run_and_keep([seg])[0]

    plain, led = draft(False), draft(True)
    assert led.shape[0] == n + 1 and plain.shape[0] == n
    torch.testing.assert_close(led[:n], plain, rtol=1e-4, atol=1e-4)
    filled = torch.tensor(block)
    q = ad.verify(state, filled, start=start, slots=[lead])
    torch.testing.assert_close(led[n], q[0], rtol=1e-4, atol=1e-4)


def test_a_shifted_model_gets_no_lead():
    model = load_or_skip("fast_dllm_v2")
    assert not model.adapter.supports_lead(True)
    out = model.generate(_prompt(model), preset="lossless", plan="auto", block_size=4, max_new_tokens=12)
    assert out.stats.ar_leads == 0


@pytest.mark.parametrize("extra", [0, 5])
def test_lossless_auto_commits_its_first_token_with_its_first_forward(model, extra):
    """Streaming: after the prompt, ``lossless-auto``'s first forward already gives AR's first token;
    ``lossless`` (plan=fixed) needs a draft and a verification."""
    prompt = _prompt(model, extra)
    ar = model.generate(prompt, decoder="ar", causal_cache=True, max_new_tokens=8, ignore_eos=True)
    firsts = {}
    for preset in ("lossless-auto", "lossless"):
        cfg = model.make_config(preset=preset, block_size=4, max_new_tokens=8, ignore_eos=True)
        engine = LLMEngine(model.adapter, max_num_seqs=1, stream=True)
        engine.add_request(prompt, cfg, "r")
        steps, first = 0, None
        while first is None:
            steps += 1
            outs = engine.step()
            first = next((o.new_token_ids for o in outs if o.new_token_ids), None)
        while engine.has_unfinished():
            engine.step()
        firsts[preset] = (steps, first[0])
    assert firsts["lossless-auto"][1] == firsts["lossless"][1] == ar.token_ids[0]
    assert firsts["lossless-auto"][0] == firsts["lossless"][0] - 1
    if model.adapter.can_fold_prefill(True):  # the prompt's whole blocks ride in the first draft
        assert firsts["lossless-auto"][0] == 1


def test_leads_keep_ar_greedy_and_save_forwards(model, monkeypatch):
    """Same tokens as AR, leads in every request, and no more forwards than the same planner without
    leads (the lead's slot needs no verification)."""
    prompts = [_prompt(model, k) for k in (0, 3, 7, 11)]
    kw = {"max_new_tokens": 24, "ignore_eos": True}
    ar = model.generate_batch(prompts, decoder="ar", causal_cache=True, **kw)
    for B in (4, 8):
        auto = model.generate_batch(prompts, preset="lossless-auto", block_size=B, **kw)
        assert [o.token_ids for o in auto] == [o.token_ids for o in ar]
        assert all(o.stats.ar_leads > 0 for o in auto)
        with monkeypatch.context() as m:
            m.setattr(type(model.adapter), "supports_lead", lambda self, causal: False)
            bare = model.generate_batch(prompts, preset="lossless-auto", block_size=B, **kw)
        assert [o.token_ids for o in bare] == [o.token_ids for o in ar]
        assert sum(o.stats.ar_leads for o in bare) == 0
        assert sum(o.stats.nfe for o in auto) <= sum(o.stats.nfe for o in bare)


@pytest.mark.parametrize("committed", [0, 2])
@pytest.mark.parametrize("pending", [0, 8])
def test_the_lead_alone_is_the_leads_row_and_keeps_the_drafts_keys(model, committed, pending):
    """``lead_segment`` (an AR-only step where committed tokens are not cached yet): its one row is the
    lead row of the draft forward, and the cache it leaves gives the same next forward as the draft's."""
    B = 8
    ad = model.adapter
    if not ad.supports_lead(True):
        pytest.skip(f"the {model.info.family} adapter has no lead")
    prompt = _prompt(model, 8)
    _, start, block = _block_after(model, prompt, B, committed)
    lead = block.index(model.info.mask_token_id)
    pend = prompt[start - pending : start]

    def row(alone: bool):
        st = ad.new_state()
        ad.prefill(st, torch.tensor(prompt[: start - pending]), block_size=B, causal=True)
        kw = {"start": start, "cached": 0, "extend": True}
        if alone:
            seg = Segment.of(st, family.lead(ad.info, st.length, pend, block, **kw))
        else:
            lay = family.draft(ad.info, st.length, pend, block, block_size=B, causal=True, lead=lead, **kw)
            seg = Segment.of(st, lay)
        out = ad.run_and_keep([seg])[0]
        assert st.length == start + lead  # the pending tokens and the committed slots are kept
        filled = torch.tensor(block)
        nxt = Segment.of(
            st, family.verify(ad.info, st.length, filled, start=start, slots=[lead + 1], cached=lead)
        )
        return out[-1], ad.run_and_keep([nxt])[0][0]

    (alone, after_alone), (led, after_draft) = row(True), row(False)
    torch.testing.assert_close(alone, led, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after_alone, after_draft, rtol=1e-4, atol=1e-4)


def test_ar_only_steps_after_a_correction_take_the_lead_alone(model, monkeypatch):
    """Forcing AR only everywhere: a block's first step (the previous block's last token is not cached)
    is the lead alone, every forward after the prompt commits one token, and the tokens are AR's."""
    prompts = [_prompt(model, k) for k in (0, 5)]
    kw = {"max_new_tokens": 20, "ignore_eos": True}
    ar = model.generate_batch(prompts, decoder="ar", causal_cache=True, **kw)
    leads = []
    real = family.lead

    def counting(*args, **kwargs):
        leads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(family, "lead", counting)  # the layout the engine asks for a lead alone
    engine = LLMEngine(model.adapter, max_num_seqs=2)
    engine.planner.force = lambda req, columns: 1 if columns == [0, 1] else 0
    cfg = model.make_config(preset="lossless-auto", block_size=4, plan_block_sizes=(), **kw)
    outs = engine.generate(prompts, [cfg] * 2)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    for o in outs:
        assert o.stats.nfe - o.stats.nfe_prefill == o.stats.generated_tokens == 20
        assert o.stats.nfe_draft == 0 and o.stats.ar_only_steps == 20
    assert len(leads) >= 2 * 5  # each of the 5 blocks of 4 begins with the lead alone

"""LLaDA2 (llada2_moe) adapter: golden logits through the protocol, prefill variants, load errors.

How each tensor of ``llada2/golden.safetensors`` maps onto the protocol (prompt P at 0..7, block
``[311, M, M, 64]`` at 8..11, draft-filled block F = ``[311, 123, 45, 64]``, block size 4; same-position, so
row j is the prediction for slot j):

* ``prefill_logits``: the forward ``prefill(P)`` runs with ``prefill_mask="official"`` (the official 1/0
  float mask added to the scores), read through ``_prefill_forward`` (prefill returns nothing); its effect
  on the cache is checked through the protocol by the two tensors below.
* ``denoise_logits``: ``draft([], block, start=8)`` after the official prefill.
* ``verify2L_logits``: rows 4..7 = ``verify(F, start=8, slots=[0, 1, 2, 3])`` (the AR logits); rows 0..3
  (first half: F token-causally) = ``draft([], F, start=8, causal=True)`` (every slot committed, so every
  row attends token-causally).
* ``*_trueblockcausal``: the same with ``prefill_mask="block-causal"``; there the prefill rows are also
  reproduced by chained drafts: ``draft([], P[0:4], start=0)`` and ``draft(pending=P[0:4], P[4:8], start=4)``,
  after which ``draft(pending=P[4:8], block, start=8)`` gives ``denoise_logits_trueblockcausal``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import family_fixture
from s2d2.errors import ModelLoadError
from s2d2.families import load_adapter

ATOL = 1e-4
PROMPT = torch.tensor([17, 42, 101, 7, 250, 3, 88, 199])
BLOCK = torch.tensor([311, 509, 509, 64])
FILLED = torch.tensor([311, 123, 45, 64])
EMPTY = torch.tensor([], dtype=torch.long)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny matrices: extra threads only add contention on a busy machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ldir() -> Path:
    return family_fixture("llada2")


@pytest.fixture(scope="module")
def golden(ldir):
    from safetensors.torch import load_file

    return load_file(str(ldir / "golden.safetensors"))


def _on_path(adapter, path: str):
    """The lean batched forward, or transformers' own ``Glm4MoeForCausalLM`` forward (the reference)."""
    assert adapter.fast is not None
    if path == "transformers":
        adapter.fast = None
    return adapter


@pytest.fixture(scope="module")
def official(ldir):
    return load_adapter(ldir, dtype="fp32", device="cpu")  # the default prefill variant


@pytest.fixture(scope="module")
def blockcausal(ldir):
    return load_adapter(ldir, dtype="fp32", device="cpu", prefill_mask="block-causal")


def cached(state) -> int:
    """Positions actually held by a row's cache (a DynamicCache counts its own; a pool row its length)."""
    return state.cache.get_seq_length() if hasattr(state.cache, "get_seq_length") else state.length


def close(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == torch.float32
    err = (actual - expected).abs().max().item()
    assert err <= ATOL, err
    return err


def test_info_and_default_variant(official, blockcausal):
    info = official.info
    assert info.family == "llada2"
    assert info.mask_token_id == 509
    assert info.shifted is False
    assert info.default_block_size == 32
    assert info.eos_token_ids == [503] and info.vocab_size == 512
    assert official.prefill_mask == "official"
    assert blockcausal.prefill_mask == "block-causal"


@pytest.mark.parametrize("path", ["fast-path", "transformers"])
@pytest.mark.parametrize("variant,suffix", [("official", ""), ("block-causal", "_trueblockcausal")])
def test_goldens(variant, suffix, path, ldir, golden):
    adapter = _on_path(load_adapter(ldir, dtype="fp32", device="cpu", prefill_mask=variant), path)
    st = adapter.new_state()
    close(
        adapter._prefill_forward(st, PROMPT, block_size=4, causal=False, n_logits=8),
        golden["prefill_logits" + suffix],
    )
    assert st.length == 8

    st = adapter.new_state()
    adapter.prefill(st, PROMPT, block_size=4, causal=False)
    assert st.length == 8
    d = adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=False)
    assert st.length == 8 and cached(st) == 8  # the block is never written
    close(d, golden["denoise_logits" + suffix])

    v2l = golden["verify2L_logits" + suffix]
    close(adapter.verify(st, FILLED, start=8, slots=[0, 1, 2, 3]), v2l[4:])
    close(adapter.verify(st, FILLED, start=8, slots=[2, 3]), v2l[6:])
    close(adapter.verify(st, FILLED, start=8, slots=[0]), v2l[4:5])
    close(adapter.draft(st, EMPTY, FILLED, start=8, block_size=4, causal=True), v2l[:4])
    assert st.length == 8 and cached(st) == 8  # verify is read only
    close(adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=False), d)


def test_true_block_causal_prefill_via_chained_drafts(blockcausal, golden):
    st = blockcausal.new_state()
    d0 = blockcausal.draft(st, EMPTY, PROMPT[:4], start=0, block_size=4, causal=False)
    d1 = blockcausal.draft(st, PROMPT[:4], PROMPT[4:], start=4, block_size=4, causal=False)
    close(torch.cat([d0, d1]), golden["prefill_logits_trueblockcausal"])
    d2 = blockcausal.draft(st, PROMPT[4:], BLOCK, start=8, block_size=4, causal=False)
    assert st.length == 8
    close(d2, golden["denoise_logits_trueblockcausal"])
    close(
        blockcausal.verify(st, FILLED, start=8, slots=[0, 1, 2, 3]),
        golden["verify2L_logits_trueblockcausal"][4:],
    )


def test_variants_really_differ(official, blockcausal):
    outs = []
    for adapter in (official, blockcausal):
        st = adapter.new_state()
        adapter.prefill(st, PROMPT, block_size=4, causal=False)
        outs.append(adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=False))
    assert (outs[0] - outs[1]).abs().max().item() > 0.1
    # a token-causal prefill is a real causal mask in both variants
    outs = []
    for adapter in (official, blockcausal):
        st = adapter.new_state()
        adapter.prefill(st, PROMPT, block_size=4, causal=True)
        outs.append(adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=True))
    close(outs[0], outs[1])


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_prefill_variant(ldir):
    with pytest.raises(ModelLoadError, match=r"prefill_mask 'causal'.*official, block-causal"):
        load_adapter(ldir, dtype="fp32", device="cpu", prefill_mask="causal")


def test_unknown_option(ldir):
    with pytest.raises(ModelLoadError, match=r"unknown option\(s\) for the llada2 family: bd_size"):
        load_adapter(ldir, dtype="fp32", device="cpu", bd_size=4)


def test_missing_mask_token(ldir, tmp_path):
    shutil.copy(ldir / "config.json", tmp_path / "config.json")  # no added_tokens.json / tokenizer.json
    with pytest.raises(ModelLoadError, match=r"no mask token.*<\|mask\|>"):
        load_adapter(tmp_path, dtype="fp32", device="cpu")


def test_mask_token_from_tokenizer_json(ldir, tmp_path):
    shutil.copy(ldir / "config.json", tmp_path / "config.json")
    shutil.copy(ldir / "model.safetensors", tmp_path / "model.safetensors")
    tok = {"added_tokens": [{"id": 509, "content": "<|mask|>", "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    assert load_adapter(tmp_path, dtype="fp32", device="cpu").info.mask_token_id == 509


def test_unsupported_router(ldir, tmp_path):
    config = json.loads((ldir / "config.json").read_text())
    config["score_function"] = "softmax"
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(ldir / "added_tokens.json", tmp_path / "added_tokens.json")
    shutil.copy(ldir / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"not a valid LLaDA2 config.*softmax"):
        load_adapter(tmp_path, dtype="fp32", device="cpu")

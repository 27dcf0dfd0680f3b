"""Fast-dLLM v2 adapter: golden logits through the protocol, family detection, load errors.

How each tensor of ``fast_dllm_v2/golden.safetensors`` maps onto the protocol (prompt P at 0..7, block
``[311, M, M, 64]`` at 8..11, draft-filled block F = ``[311, 123, 45, 64]``, block size 4). The fixture's
"raw" rows are the model's unshifted rows (row i scores the token after position 8+i); the adapter returns
rows aligned to block slots (row j = prediction for slot j), so raw row i is our row i+1.

* ``prefill_logits`` (block-causal, 8 rows): rows 0..2 = rows 1..3 of ``draft([], P[0:4], start=0)``;
  row 3 = row 0 and rows 4..6 = rows 1..3 of ``draft(pending=P[0:4], P[4:8], start=4)``; row 7 = row 0 of
  ``draft(pending=P[4:8], block, start=8)`` and row 0 of ``draft([], block)`` after ``prefill(P)`` (the
  saved last prefill row). All 8 rows are also checked through ``_commit_forward``, the forward prefill runs.
* ``denoise_logits_raw``: rows 0..2 = draft rows 1..3. Row 3 scores position 12, outside the block: after
  ``commit(block)`` (the masked block written as if committed) it is the saved prediction for slot 0 of the
  next block, read with ``verify(..., start=12, slots=[0])``.
* ``denoise_logits_shifted``: rows 1..3 = draft rows 1..3. Its row 0 is the reference's placeholder (raw
  row 0, really the prediction for slot 1); our draft row 0 is the TRUE prediction for slot 0 from the
  previous position, ``ar_pred_logits[0] == prefill_logits[7]``.
* ``verify_logits_raw``: rows 0..2 = ``verify(F, slots=[1, 2, 3])``; row 3 = saved prediction after
  ``commit(F, causal=True)`` (token-causal), read with ``verify(..., start=12, slots=[0])``.
* ``verify_logits_shifted``: rows 1..3 = verify rows for slots 1..3; row 0 is the same placeholder as above.
* ``ar_pred_logits``: exactly ``verify(F, start=8, slots=[0, 1, 2, 3])`` (the true AR predictive logits).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import family_fixture
from s2d2.errors import ModelLoadError
from s2d2.families import detect_family, fast_dllm_v2, llada2, load_adapter, sdar
from s2d2.families.checkpoint import read_config

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
def fdir() -> Path:
    return family_fixture("fast_dllm_v2")


@pytest.fixture(scope="module")
def adapter(fdir):
    return load_adapter(fdir, dtype="fp32", device="cpu")


@pytest.fixture(scope="module")
def golden(fdir):
    from safetensors.torch import load_file

    return load_file(str(fdir / "golden.safetensors"))


def close(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == torch.float32
    err = (actual - expected).abs().max().item()
    assert err <= ATOL, err
    return err


# ---------------------------------------------------------------------------------------------- goldens
def test_info(adapter):
    info = adapter.info
    assert info.family == "fast_dllm_v2"
    assert info.mask_token_id == 509
    assert info.shifted is True
    assert info.default_block_size == 4  # bd_size
    assert info.eos_token_ids == [503] and info.bos_token_id == 501 and info.vocab_size == 512


def test_prefill_logits_all_rows(adapter, golden):
    st = adapter.new_state()
    rows = adapter._commit_forward(st, PROMPT, block_size=4, causal=False, n_logits=8)
    close(rows, golden["prefill_logits"])
    assert st.length == 8


def test_prefill_logits_via_chained_drafts(adapter, golden):
    ref = golden["prefill_logits"]
    st = adapter.new_state()
    d0 = adapter.draft(st, EMPTY, PROMPT[:4], start=0, block_size=4, causal=False)
    assert torch.equal(d0[0], torch.zeros(512))  # nothing before position 0: uniform
    close(d0[1:], ref[0:3])
    d1 = adapter.draft(st, PROMPT[:4], PROMPT[4:], start=4, block_size=4, causal=False)
    close(d1, ref[3:7])
    assert st.length == 4
    d2 = adapter.draft(st, PROMPT[4:], BLOCK, start=8, block_size=4, causal=False)
    close(d2[0], ref[7])
    close(d2[1:], golden["denoise_logits_shifted"][1:])
    assert st.length == 8
    # same cache as a plain prefill: verification agrees
    close(adapter.verify(st, FILLED, start=8, slots=[0, 1, 2, 3]), golden["ar_pred_logits"])


def test_denoise_and_verify(adapter, golden):
    st = adapter.new_state()
    adapter.prefill(st, PROMPT, block_size=4, causal=False)
    assert st.length == 8
    d = adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=False)
    assert st.length == 8  # the block is never written
    close(d[1:], golden["denoise_logits_shifted"][1:])
    close(d[1:], golden["denoise_logits_raw"][:3])
    close(d[0], golden["ar_pred_logits"][0])  # true prediction for slot 0 (not the placeholder)
    close(d[0], golden["prefill_logits"][7])
    assert (d[0] - golden["denoise_logits_shifted"][0]).abs().max() > 1  # fixture row 0: a placeholder

    v = adapter.verify(st, FILLED, start=8, slots=[0, 1, 2, 3])
    close(v, golden["ar_pred_logits"])
    close(v[1:], golden["verify_logits_shifted"][1:])
    close(v[1:], golden["verify_logits_raw"][:3])
    assert st.length == 8  # read only
    close(adapter.verify(st, FILLED, start=8, slots=[2]), golden["ar_pred_logits"][2:3])
    close(adapter.verify(st, FILLED, start=8, slots=[0]), golden["ar_pred_logits"][0:1])
    close(adapter.verify(st, FILLED, start=8, slots=[1, 3]), golden["ar_pred_logits"][[1, 3]])
    # nothing changed: the draft is reproducible
    close(adapter.draft(st, EMPTY, BLOCK, start=8, block_size=4, causal=False), d)


def test_last_raw_rows_via_commit(adapter, golden):
    """Raw row 3 of the denoise/verify forwards scores position 12: the saved prediction after a commit."""
    for ids, causal, ref in (
        (BLOCK, False, golden["denoise_logits_raw"][3]),
        (FILLED, True, golden["verify_logits_raw"][3]),
    ):
        st = adapter.new_state()
        adapter.prefill(st, PROMPT, block_size=4, causal=False)
        adapter.commit(st, ids, block_size=4, causal=causal)
        assert st.length == 12
        close(adapter.verify(st, FILLED, start=12, slots=[0])[0], ref)


# ---------------------------------------------------------------------------------------------- detection
@pytest.mark.parametrize("name,family", [("sdar", sdar), ("fast_dllm_v2", fast_dllm_v2), ("llada2", llada2)])
def test_detect_fixture_dirs(name, family):
    path = family_fixture(name)
    assert detect_family(read_config(path), path) is family


def test_detect_by_architecture_and_auto_map():
    assert detect_family({"architectures": ["Fast_dLLM_QwenForCausalLM"]}) is fast_dllm_v2
    auto = {"AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"}
    assert detect_family({"model_type": "custom", "auto_map": auto}) is fast_dllm_v2
    assert detect_family({"architectures": ["LLaDA2MoeModelLM"]}) is llada2
    auto = {"AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"}
    assert detect_family({"auto_map": auto}) is llada2
    assert detect_family({"model_type": "SDAR"}) is sdar


# ---------------------------------------------------------------------------------------------- errors
def write_config(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_unsupported_model_type(tmp_path):
    path = write_config(tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ModelLoadError, match=r"unsupported model_type 'gpt2'.*fast_dllm_v2.*llada2"):
        load_adapter(path, dtype="fp32", device="cpu")


def test_remote_code_only_config(tmp_path):
    auto = {"AutoConfig": "configuration_foo.FooConfig", "AutoModelForCausalLM": "modeling_foo.FooLM"}
    path = write_config(tmp_path, {"model_type": "foo_dlm", "auto_map": auto})
    with pytest.raises(ModelLoadError, match=r"unsupported model_type 'foo_dlm'"):
        load_adapter(path, dtype="fp32", device="cpu")
    path = write_config(tmp_path, {"auto_map": auto})
    with pytest.raises(ModelLoadError, match=r"remote code"):
        load_adapter(path, dtype="fp32", device="cpu")


def test_unknown_option(fdir):
    with pytest.raises(ModelLoadError, match=r"option\(s\) for the fast_dllm_v2 family: prefill_mask"):
        load_adapter(fdir, dtype="fp32", device="cpu", prefill_mask="official")


def test_missing_mask_token(fdir, tmp_path):
    shutil.copy(fdir / "config.json", tmp_path / "config.json")  # no added_tokens.json / tokenizer.json
    with pytest.raises(ModelLoadError, match=r"no mask token.*\|<MASK>\|"):
        load_adapter(tmp_path, dtype="fp32", device="cpu")

"""Stop ids, block size, mask id and generation defaults resolved from a checkpoint's side files
(:mod:`s2d2.families.checkpoint_facts`), and what loading does with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, published
from s2d2.errors import ModelLoadError
from s2d2.families import llada2, sdar
from s2d2.families.checkpoint_facts import FamilyRules, checkpoint_names, resolve_facts
from s2d2.families.side_files import read_side_files

RULES = FamilyRules(mask_tokens=("<m>",), published_block_size=4)


def _write(directory: Path, **files: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    files.setdefault("config", {"model_type": "sdar"})
    for name, data in files.items():
        (directory / f"{name}.json").write_text(json.dumps(data))
    return directory


def _facts(directory: Path, rules: FamilyRules = RULES, **kw):
    return resolve_facts(read_side_files(directory), rules, **kw)


def test_stop_ids_are_the_union_of_config_generation_config_and_the_tokenizer_eos(tmp_path):
    d = _write(
        tmp_path,
        config={"eos_token_id": 5},
        generation_config={"eos_token_id": [7, 5]},
        tokenizer_config={"eos_token": "<e>", "added_tokens_decoder": {"9": {"content": "<e>"}}},
    )
    assert _facts(d).stop_token_ids == [5, 7, 9]


def test_an_eos_text_without_an_added_id_takes_the_id_of_the_role_spelled_the_same(tmp_path):
    """LLaDA2.x: no eos id anywhere, but its eos text is its pad token, whose id the config gives."""
    d = _write(
        tmp_path, config={"pad_token_id": 41}, special_tokens_map={"eos_token": "<z>", "pad_token": "<z>"}
    )
    assert _facts(d).stop_token_ids == [41]
    assert _facts(d, FamilyRules(("<m>",), 4, end_of_turn=("<t>",))).stop_token_ids == [41]
    d = _write(tmp_path / "b", added_tokens={"<t>": 3}, config={"eos_token_id": 1})
    assert _facts(d, FamilyRules(("<m>",), 4, end_of_turn=("<t>",))).stop_token_ids == [1, 3]


def test_block_size_option_then_config_then_name_suffix_then_family_default(tmp_path):
    d = _write(tmp_path / "Model-b16")
    assert (_facts(d).block_size, _facts(d).block_size_source) == (16, "name")
    got = _facts(d, block_size_option=8)
    assert (got.block_size, got.block_size_source) == (8, "option")
    got = _facts(d, name="org/Other-B32")
    assert (got.block_size, got.block_size_source) == (32, "name")
    d = _write(tmp_path / "plain")
    assert (_facts(d).block_size, _facts(d).block_size_source) == (4, "family default")
    d = _write(tmp_path / "cfg-b16", config={"model_type": "sdar", "bd_size": 2})
    assert (_facts(d).block_size, _facts(d).block_size_source) == (2, "config.json:bd_size")
    with pytest.raises(ModelLoadError, match="block_size must be >= 1, got 0"):
        _facts(d, block_size_option=0)


def test_a_hub_cache_snapshot_names_its_repository(tmp_path):
    snap = tmp_path / "models--JetLM--SDAR-30B-A3B-Chat-b32" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert checkpoint_names(snap) == ["SDAR-30B-A3B-Chat-b32", "abc123"]


def test_mask_id_from_config_then_tokenizer_then_family_names_then_published(tmp_path):
    d = _write(
        tmp_path / "a",
        tokenizer_config={"mask_token": "<x>", "added_tokens_decoder": {"8": {"content": "<x>"}}},
    )
    assert _facts(d).mask_token_id == 8
    d = _write(tmp_path / "b", config={"mask_token_id": 2}, added_tokens={"<m>": 6})
    assert _facts(d).mask_token_id == 2
    d = _write(tmp_path / "c", added_tokens={"<m>": 6})
    assert _facts(d).mask_token_id == 6
    d = _write(tmp_path / "d")
    assert _facts(d).mask_token_id is None
    assert _facts(d, FamilyRules(("<m>",), 4, published_mask_id=99)).mask_token_id == 99
    with pytest.raises(ModelLoadError, match=r"no mask token.*'<m>'.*usual id 99 is outside the vocabulary"):
        _facts(d, FamilyRules(("<m>",), 4, published_mask_id=99)).require_mask(d, 50)


def test_generation_defaults_auto_off_or_a_folder(tmp_path):
    gen = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_new_tokens": 9}
    d = _write(tmp_path / "m", generation_config=gen)
    assert _facts(d).generation_defaults == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert _facts(d, generation_config="vllm").generation_defaults == {}
    assert _facts(d, generation_config="off").generation_defaults == {}
    other = _write(tmp_path / "o", generation_config={"min_p": 0.1, "repetition_penalty": 1.1})
    assert _facts(d, generation_config=str(other)).generation_defaults == {
        "min_p": 0.1,
        "repetition_penalty": 1.1,
    }
    with pytest.raises(ModelLoadError, match="generation_config must be auto, vllm, off or a folder"):
        _facts(d, generation_config="sometimes")


@pytest.mark.parametrize(("folder", "family"), [("SDAR-4B-Chat", sdar), ("LLaDA2.1-mini", llada2)])
def test_published_side_files_give_their_facts(folder, family):
    path = published(folder)
    facts = resolve_facts(read_side_files(path), family.RULES)
    gen = json.loads((path / "generation_config.json").read_text())
    if folder.startswith("SDAR"):
        assert set(facts.stop_token_ids) == {151643, 151645} and set(gen["eos_token_id"]) <= set(
            facts.stop_token_ids
        )
        decoder = json.loads((path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
        assert facts.mask_token_id == next(int(k) for k, v in decoder.items() if v["content"] == "<|MASK|>")
        assert (facts.block_size, facts.block_size_source) == (4, "family default")
    else:
        assert 156892 in facts.stop_token_ids and gen["pad_token_id"] in facts.stop_token_ids
        assert (facts.mask_token_id, facts.block_size) == (156895, 32)


def _sdar_copy(tmp_path: Path, **files: dict) -> Path:
    d = tmp_path / "sdar"
    shutil.copytree(FIXTURES / "sdar", d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["block_size"]
    return _write(d, config=cfg, **files)


def test_loading_applies_the_facts_and_generation_defaults(tmp_path):
    import s2d2

    if not (FIXTURES / "sdar").is_dir():
        pytest.skip(f"conformance fixtures not found in {FIXTURES}")
    gen = {"eos_token_id": [4, 503], "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    d = _sdar_copy(tmp_path, generation_config=gen)
    m = s2d2.load(d, device="cpu", dtype="fp32", block_size=8)
    assert m.info.eos_token_ids == [503, 4] and (m.info.default_block_size, m.info.block_size_source) == (
        8,
        "option",
    )
    cfg = m.default_config()
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.block_size) == (0.6, 20, 0.95, 8)
    assert m.make_config(preset="lossless").temperature == 0.0  # a lossless preset stays greedy
    assert m.make_config(temperature=0.0).temperature == 0.0
    off = s2d2.load(d, device="cpu", dtype="fp32", generation_config="vllm")
    assert (off.default_config().temperature, off.default_config().top_k) == (0.0, 0)
    assert (off.info.default_block_size, off.info.block_size_source) == (4, "family default")
    stop = m.generate([1, 2, 3], max_new_tokens=6, logit_bias={4: 100.0}, temperature=0.0)
    assert stop.token_ids == [4] and stop.stats.generated_tokens == 1
    on = m.generate([1, 2, 3], max_new_tokens=6, logit_bias={4: 100.0}, temperature=0.0, ignore_eos=True)
    assert on.token_ids == [4] * 6

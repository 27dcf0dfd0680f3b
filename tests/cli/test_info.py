"""``s2d2 info`` on the published checkpoints' side files (no weights): every field, offline, with stdin
closed (a subprocess that would wait on stdin would time out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import published
from hub_cache import add_snapshot

#: folder -> (family, tool-call parser, reasoning parser, block size, index tensor count)
EXPECTED = {
    "SDAR-4B-Chat": ("sdar", "hermes", "qwen3", 4, 399),
    "SDAR-30B-A3B-Chat": ("sdar_moe", "hermes", "qwen3", 4, 18_867),
    "LLaDA2.1-mini": ("llada2", "llada2", None, 32, 14_813),
}


def info(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``s2d2 info ARGS`` with stdin closed, at most 60 s."""
    env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "s2d2.cli", "info", *args]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)


def info_json(*args: str, env: dict | None = None) -> dict:
    done = info(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_info_reports_what_the_side_files_give(folder):
    path = published(folder)
    family, tools, reasoning, block, tensors = EXPECTED[folder]
    got = info_json(str(path))
    assert list(got) == [
        "family", "architecture", "block_size", "block_size_source", "mask_token_id", "stop_token_ids",
        "tool_call_parser", "reasoning_parser", "generation_defaults", "parameters", "weights",
        "tensor_parallel_size", "bytes_per_rank",
    ]  # fmt: skip
    config = json.loads((path / "config.json").read_text())
    gen = json.loads((path / "generation_config.json").read_text())
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert (got["family"], got["architecture"]) == (family, config["architectures"][0])
    assert (got["block_size"], got["block_size_source"]) == (block, "family default")
    assert (got["tool_call_parser"], got["reasoning_parser"]) == (tools, reasoning)
    assert got["weights"] == {
        "files": len(set(index["weight_map"].values())), "tensors": tensors, "missing": [], "unexpected": [],
    }  # fmt: skip
    half = index["metadata"]["total_size"] / 2
    assert abs(got["parameters"] - half) <= 0.01 * half
    assert (
        abs(got["bytes_per_rank"] - index["metadata"]["total_size"]) <= 0.01 * index["metadata"]["total_size"]
    )
    sampling = {
        k: gen[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty") if k in gen
    }
    assert got["generation_defaults"] == sampling
    if family == "llada2":
        assert {156892} <= set(got["stop_token_ids"]) and got["mask_token_id"] == 156895
    else:
        assert (
            set(got["stop_token_ids"])
            == {151643, 151645}
            == set(gen["eos_token_id"]) | {config["eos_token_id"]}
        )
        decoder = json.loads((path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
        assert got["mask_token_id"] == next(int(k) for k, v in decoder.items() if v["content"] == "<|MASK|>")


def test_bytes_per_rank_and_a_split_that_cannot_be():
    path = published("SDAR-30B-A3B-Chat")
    total = json.loads((path / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    got = info_json(str(path), "--tp", "4")
    assert got["tensor_parallel_size"] == 4 and total / 4 <= got["bytes_per_rank"] <= total / 4 * 1.01
    bad = info(str(path), "--tp", "3")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "tensor_parallel_size 3 does not divide the model's 32 attention heads" in bad.stderr


def test_block_size_from_the_option_the_directory_and_a_cached_repository(tmp_path):
    source = published("SDAR-4B-Chat")
    local = tmp_path / "SDAR-4B-Chat-b16"
    local.mkdir()
    for name in (
        "config.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
    ):
        shutil.copy(source / name, local / name)
    got = info_json(str(local))
    assert (got["block_size"], got["block_size_source"]) == (16, "name")
    assert got["generation_defaults"] == {} and got["stop_token_ids"] == [151643]  # no generation_config.json
    got = info_json(str(local), "--block-size", "8", "--generation-config", "vllm")
    assert (got["block_size"], got["block_size_source"]) == (8, "option")
    cache = tmp_path / "hub"
    add_snapshot(cache, "JetLM/SDAR-4B-Chat-b32", local)
    got = info_json("JetLM/SDAR-4B-Chat-b32", env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "0"})
    assert (got["block_size"], got["block_size_source"]) == (32, "name")


def test_the_human_table_and_a_missing_model(tmp_path):
    done = info(str(published("LLaDA2.1-mini")))
    assert done.returncode == 0 and "llada2 (LLaDA2MoeModelLM)" in done.stdout
    assert "32 (family default)" in done.stdout and "missing 0; unexpected 0" in done.stdout
    gone = info(str(tmp_path / "nothing"))
    assert (
        gone.returncode == 2 and gone.stderr == f"error: model path does not exist: {tmp_path / 'nothing'}\n"
    )

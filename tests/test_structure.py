"""The structure rules of docs/ARCHITECTURE.md, checked: no source file over 400 lines, and the engine's top
level at most 14 modules (the rest of the engine lives in its packages: ``planner``, ``step``, ``runner``).
The import rules (no cycle, no upward import) are tests/test_architecture.py's."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "s2d2"
MAX_LINES = 400
MAX_ENGINE_TOP_LEVEL = 14


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_source_file_is_over_400_lines():
    over = sorted(f"{p.relative_to(SRC)}: {n}" for p in SRC.rglob("*.py") if (n := _lines(p)) > MAX_LINES)
    assert over == [], "split along concepts: " + ", ".join(over)


def test_the_engine_top_level_holds_at_most_14_modules():
    top = sorted(p.name for p in (SRC / "engine").glob("*.py"))
    assert len(top) <= MAX_ENGINE_TOP_LEVEL, top


def test_the_families_and_the_forward_hold_what_their_names_say():
    """``families/`` holds the model families and their loading, ``forward/`` the machinery every family's
    forward runs on (docs/ARCHITECTURE.md): each module's name is listed here, so a new one is placed on
    purpose."""
    families = {
        "__init__", "base", "checkpoint", "hf", "sdar", "sdar_moe", "fast_dllm_v2", "llada2", "sharding",
        "expert_parallel", "side_files", "checkpoint_facts", "tokenizer", "tensor_names",
        "loader",
    }  # fmt: skip
    forward = {
        "__init__", "attention_groups", "describe", "fastpath", "forward_batch", "graph_runner", "host_lists",
        "kv_pages", "kv_pool", "masks", "paged_forward", "routed_experts", "segment", "small_ops",
        "span_attention", "span_attention_kernel", "tensor_parallel", "vocab_summary",
    }  # fmt: skip
    held = {name: {p.stem for p in (SRC / name).glob("*.py")} for name in ("families", "forward")}
    assert {"sdar", "fast_dllm_v2", "llada2"} <= held["families"] <= families
    assert {"forward_batch", "kv_pool", "span_attention"} <= held["forward"] <= forward

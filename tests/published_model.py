"""A tiny random model built on a published checkpoint's side files: the tokenizer, chat template and
generation config of ``../shared/fixtures/published/SDAR-4B-Chat`` (copied unchanged), its config with the
dimensions scaled way down (the vocabulary, special ids, rope and everything else kept), random weights.

:func:`published_sdar_model` writes it (or skips when the published side files are absent); what it
serves is the published tokenizer and template exactly, so a test of stopping, tools, thinking or the mask
text over it sees what a user of the real checkpoint would. The weights are random: a test makes it write
what it needs with ``logit_bias`` or a structured-output constraint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from conftest import published

#: The published checkpoint whose side files the tiny model uses.
SOURCE = "SDAR-4B-Chat"
#: Every side file of the source but its config and weight index (the config is rewritten, no index).
SIDE_FILES = (
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
#: The scaled-down dimensions (the rest of the published config is kept).
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=4096,
    max_window_layers=2,
    tie_word_embeddings=True,  # one vocabulary-sized matrix instead of two
)


def published_sdar_model(directory: Path, *, seed: int = 0, std: float = 0.5) -> Path:
    """Write the tiny model into ``directory`` (created) and return it."""
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    from s2d2.families.sdar import qwen3_config

    source = published(SOURCE)
    directory.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        shutil.copy(source / name, directory / name)
    config = {**json.loads((source / "config.json").read_text()), **TINY}
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(config))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def published_side_file(name: str) -> dict:
    """A JSON side file of the source checkpoint (what a test expects is read from the files too)."""
    return json.loads((published(SOURCE) / name).read_text())

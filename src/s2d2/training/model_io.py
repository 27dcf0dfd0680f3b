"""The tiny-gsm network (a ``transformers`` Qwen3 model) and its on-disk SDAR format.

An SDAR directory holds ``config.json`` (the SDAR config of :func:`sdar_config`), ``model.safetensors``
(float32, Qwen3 parameter names) and the tiny-gsm tokenizer files.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

# the module, not its names: save_sdar_dir's argument ``tokenizer_dir`` shadows the function
from s2d2.tasks.tiny_gsm import tokenizer

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MODEL_SIZE",
    "build_model",
    "load_sdar_dir",
    "qwen3_config",
    "save_sdar_dir",
    "sdar_config",
]

MODEL_SIZE = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    intermediate_size=384,
)
DEFAULT_BLOCK_SIZE = 4


def sdar_config(tok, size: dict | None = None, task: str = "tiny-gsm") -> dict:
    """The SDAR ``config.json`` for a tiny model of ``task`` (tiny-gsm | tiny-code) with tokenizer ``tok``."""
    size = dict(MODEL_SIZE if size is None else size)
    vocab = int(math.ceil(len(tok) / 8) * 8)
    import transformers

    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "mask_token_id": tok.mask_token_id,
        "block_size": DEFAULT_BLOCK_SIZE,
        "head_dim": size["head_dim"],
        "hidden_act": "silu",
        "hidden_size": size["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": size["intermediate_size"],
        "max_position_embeddings": 512,
        "max_window_layers": size["num_hidden_layers"],
        "num_attention_heads": size["num_attention_heads"],
        "num_hidden_layers": size["num_hidden_layers"],
        "num_key_value_heads": size["num_key_value_heads"],
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": transformers.__version__,
        "use_cache": False,
        "vocab_size": vocab,
        "s2d2_task": task,
    }


def qwen3_config(cfg: dict):
    """Map an SDAR config dict onto ``transformers.Qwen3Config`` (sdpa attention)."""
    from transformers import Qwen3Config

    qc = Qwen3Config(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        hidden_act=cfg["hidden_act"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=None,
        pad_token_id=cfg["pad_token_id"],
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"],
        use_cache=False,
    )
    qc._attn_implementation = "sdpa"
    return qc


def build_model(cfg: dict, seed: int = 0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(cfg))
    return model.float()


def save_sdar_dir(model, cfg: dict, directory: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` (float32, Qwen3 names) and the tokenizer files
    (:data:`s2d2.tasks.tiny_gsm.tokenizer.TOKENIZER_FILES`, copied from ``tokenizer_dir``, default
    :func:`s2d2.tasks.tiny_gsm.tokenizer.tokenizer_dir`)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    src = tokenizer.tokenizer_dir() if tokenizer_dir is None else Path(tokenizer_dir)
    for name in tokenizer.TOKENIZER_FILES:
        shutil.copy(src / name, tmp / name)
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
    return directory


def load_sdar_dir(directory: Path):
    """Load an SDAR-format directory written by :func:`save_sdar_dir` into ``Qwen3ForCausalLM``."""
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    cfg = json.loads((Path(directory) / "config.json").read_text())
    model = Qwen3ForCausalLM(qwen3_config(cfg))
    missing, unexpected = model.load_state_dict(
        load_file(str(Path(directory) / "model.safetensors")), strict=False
    )
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise RuntimeError(f"bad checkpoint: missing={missing} unexpected={unexpected}")
    return model.float().eval(), cfg

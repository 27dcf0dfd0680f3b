"""Public API: ``s2d2.load(...)`` and ``model.generate(...)``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .adapters import ModelAdapter, load_adapter
from .config import DecodeConfig
from .decoding.engine import decode
from .decoding.stats import GenerationStats, StepTrace
from .errors import ModelLoadError, PromptError

#: Models shipped inside the package, by name.
BUILTIN_MODELS = ("tiny-gsm",)
DEFAULT_MODEL = "tiny-gsm"


def builtin_path(name: str) -> Path:
    return Path(str(resources.files("s2d2") / "models" / name))


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A built-in model's directory, or the user's path as given."""
    name = str(name_or_path)
    if name in BUILTIN_MODELS:
        path = builtin_path(name)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"the built-in model {name!r} is not installed in this package ({path})")
        return path
    return Path(name).expanduser()


@dataclass
class GenerationResult:
    """What ``generate`` returns: the new text and token ids (through the first stop token) and stats."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    trace: list[StepTrace] | None = None
    config: DecodeConfig | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict()}


class S2D2Model:
    """A block-diffusion model ready to decode: an adapter plus (optionally) its tokenizer."""

    def __init__(
        self,
        adapter: ModelAdapter,
        tokenizer: Any | None = None,
        path: Path | None = None,
        name: str | None = None,
    ):
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.path = path
        self.name = name or (str(path) if path else adapter.info.family)

    @property
    def info(self):
        return self.adapter.info

    def default_config(self) -> DecodeConfig:
        """Defaults adapted to the checkpoint (its configured block size)."""
        bs = self.info.default_block_size
        return DecodeConfig(block_size=int(bs)) if bs else DecodeConfig()

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise PromptError(f"model {self.name} has no tokenizer: pass token ids instead of text")
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise PromptError(f"model {self.name} has no chat template; drop --chat")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=False)]

    def decode_ids(self, ids: Sequence[int]) -> str:
        stops = set(self.info.eos_token_ids)
        ids = list(ids)
        if ids and ids[-1] in stops:
            ids = ids[:-1]
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ generation
    def make_config(self, config: DecodeConfig | None = None, **settings: Any) -> DecodeConfig:
        preset = settings.pop("preset", None)
        return DecodeConfig.build(
            config if config is not None else self.default_config(), preset=preset, **settings
        )

    def generate(
        self,
        prompt: str | Sequence[int],
        config: DecodeConfig | None = None,
        *,
        chat: bool = False,
        **settings: Any,
    ) -> GenerationResult:
        """Decode a continuation of ``prompt`` (text, or token ids).

        ``settings`` use the CLI flags' names with underscores (``decoder``, ``preset``, ``block_size``,
        ``steps``, ``threshold``, ``policy``, ``estimator``, ``max_new_tokens``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, ...); they override ``config`` and the preset.
        """
        cfg = self.make_config(config, **settings)
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat=chat)
        elif isinstance(prompt, torch.Tensor):
            ids = prompt.view(-1).tolist()
        else:
            ids = list(prompt)
        out = decode(self.adapter, ids, cfg)
        return GenerationResult(
            text=self.decode_ids(out.token_ids),
            token_ids=out.token_ids,
            stats=out.stats,
            trace=out.trace,
            config=cfg,
        )


def load_tokenizer(path: Path) -> Any | None:
    """The directory's tokenizer through transformers (never remote code), or None if it has none."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    import warnings

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # AutoTokenizer reads config.json and warns about the unknown model_type
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # tokenizers raise many types; the user needs one line
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def load(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | None = None,
    **options: Any,
) -> S2D2Model:
    """Load a block-diffusion model: a built-in name (``tiny-gsm``) or a local checkpoint directory.

    The family is detected from ``config.json``; no remote code is executed; weights are read from
    safetensors. ``device``: cpu | cuda (default: cuda if available); ``dtype``: bf16 | fp16 | fp32
    (default: fp32 on CPU, bf16 on CUDA). ``options`` go to the family's loader.
    """
    path = resolve_model_path(name_or_path)
    adapter = load_adapter(path, device=device, dtype=dtype, **options)
    tokenizer = load_tokenizer(path)
    name = str(name_or_path)
    return S2D2Model(adapter, tokenizer, path, name=name)

r"""What s2d2 does with a checkpoint, resolved from its side files (:mod:`.side_files`) and its family's
rules (:class:`FamilyRules`, one per family module as ``RULES``), in one place for loading and for
``s2d2 info``:

* **stop ids**: the union of ``config.json``'s ``eos_token_id``, ``generation_config.json``'s
  ``eos_token_id``, the tokenizer's eos token and the family's own end-of-turn tokens (by text);
* **block size**: the option, else the config (``block_size``/``block_length``/``bd_size``), else a
  ``-b(\d+)`` suffix of the repo or directory name, else the family's published default, with its source;
* **mask id**: ``config.json``'s ``mask_token_id``, else the tokenizer's mask token, else one of the
  family's mask texts among the added tokens, else the id the family's engines use;
* **generation defaults**: the sampling fields of ``generation_config.json`` (as vLLM's
  ``--generation-config auto``), or none (``vllm``/``off``), or those of another folder's file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .base import ModelInfo
from .side_files import SideFiles, read_json

#: ``generation_config.json`` fields that become a request's defaults, and their DecodeConfig names.
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
#: Config keys that state a block size, first found wins.
BLOCK_SIZE_KEYS = ("block_size", "block_length", "bd_size")
#: ``generation_config`` option values that turn the checkpoint's defaults off (vLLM's, and s2d2's).
GENERATION_CONFIG_OFF = ("vllm", "off")
_SUFFIX = re.compile(r"-b(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class FamilyRules:
    """A family's own facts where the checkpoint's files are silent."""

    #: tokenizer texts of the mask token, most likely first
    mask_tokens: tuple[str, ...]
    #: the block size the family's published checkpoints are run with
    published_block_size: int
    #: the mask id the family's engines use when no file names one (None: a file must)
    published_mask_id: int | None = None
    #: texts of the end-of-turn tokens the family's own generation code stops on
    end_of_turn: tuple[str, ...] = ()


@dataclass
class CheckpointFacts:
    """Stop ids, block size (and where it came from), mask id and generation defaults of a checkpoint."""

    stop_token_ids: list[int]
    block_size: int
    block_size_source: str
    mask_token_id: int | None
    generation_defaults: dict[str, float] = field(default_factory=dict)
    #: the family's first mask text (named when no mask id is found)
    mask_text: str = "<|mask|>"
    #: True when the mask id is the family's published one (no file names it)
    mask_from_family: bool = False

    def require_mask(self, path: Path, vocab_size: int) -> int:
        """The mask id, or a one-line :class:`ModelLoadError` (none found, or outside the vocabulary)."""
        unknown = self.mask_token_id is None or not 0 <= self.mask_token_id < vocab_size
        if self.mask_token_id is None or (unknown and self.mask_from_family):
            usual = f" (the family's usual id {self.mask_token_id} is outside the vocabulary)"
            usual = usual if self.mask_from_family else ""
            raise ModelLoadError(
                f"{path}: no mask token: config.json has no mask_token_id and the tokenizer names neither a "
                f"mask token nor {self.mask_text!r}{usual}"
            )
        if unknown:
            raise ModelLoadError(
                f"mask token id {self.mask_token_id} is outside the vocabulary (size {vocab_size})"
            )
        return self.mask_token_id


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, list) else []


def stop_token_ids(side: SideFiles, rules: FamilyRules) -> list[int]:
    """The union of every stop id the files give (in order of first mention)."""
    found = _ids(side.config.get("eos_token_id")) + _ids(side.generation_config.get("eos_token_id"))
    for text in (side.special_token("eos"), *rules.end_of_turn):
        tid = side.token_id(text) if text else None
        if tid is not None:
            found.append(tid)
    return list(dict.fromkeys(found))


def mask_token_id(side: SideFiles, rules: FamilyRules) -> int | None:
    """The mask id by the rule of the module docstring (None: nothing names one)."""
    if side.config.get("mask_token_id") is not None:
        return int(side.config["mask_token_id"])
    for text in (side.special_token("mask"), *rules.mask_tokens):
        tid = side.token_id(text) if text else None
        if tid is not None:
            return tid
    return rules.published_mask_id


def name_suffix_block_size(names: list[str]) -> int | None:
    """The block size a ``-bN`` suffix of the first name carrying one gives (``SDAR-30B-A3B-Chat-b32``)."""
    for name in names:
        got = _SUFFIX.search(name.rstrip("/"))
        if got:
            return int(got.group(1))
    return None


def checkpoint_names(path: Path, name: str | None = None) -> list[str]:
    """The names a block-size suffix may sit on: the given name (a repo id), the repository of a Hugging Face
    cache snapshot (``models--ORG--NAME/snapshots/REV``), and the directory's own name."""
    names = [name] if name else []
    parts = path.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        names.append(parts[-3].split("--", 2)[-1])
    names.append(path.name)
    return names


def block_size(side: SideFiles, rules: FamilyRules, option: int | None, names: list[str]) -> tuple[int, str]:
    """The block size and its source: ``option``, ``config.json:KEY``, ``name`` or ``family default``."""
    if option is not None:
        if int(option) < 1:
            raise ModelLoadError(f"block_size must be >= 1, got {option}")
        return int(option), "option"
    for key in BLOCK_SIZE_KEYS:
        if side.config.get(key):
            return int(side.config[key]), f"config.json:{key}"
    suffix = name_suffix_block_size(names)
    if suffix:
        return suffix, "name"
    return rules.published_block_size, "family default"


def generation_defaults(side: SideFiles, setting: str | Path | None = "auto") -> dict[str, float]:
    """The sampling defaults ``setting`` asks for: ``auto`` (None too) the checkpoint's
    ``generation_config.json``, ``vllm``/``off`` none, a directory its ``generation_config.json``."""
    setting = "auto" if setting is None else str(setting)
    if setting in GENERATION_CONFIG_OFF:
        return {}
    if setting == "auto":
        source = side.generation_config
    else:
        folder = Path(setting).expanduser()
        if not (folder / "generation_config.json").is_file():
            raise ModelLoadError(
                f"generation_config must be auto, vllm, off or a folder holding generation_config.json; "
                f"got {setting!r}"
            )
        source = read_json(folder / "generation_config.json")
    out: dict[str, float] = {}
    for key in SAMPLING_FIELDS:
        value = source.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value) if key == "top_k" else float(value)
    return out


def resolve_facts(
    side: SideFiles,
    rules: FamilyRules,
    *,
    block_size_option: int | None = None,
    name: str | None = None,
    generation_config: str | Path | None = "auto",
) -> CheckpointFacts:
    """Every fact of the module docstring for one checkpoint."""
    size, source = block_size(side, rules, block_size_option, checkpoint_names(side.path, name))
    mask = mask_token_id(side, rules)
    named = mask_token_id(side, FamilyRules(rules.mask_tokens, rules.published_block_size)) is not None
    return CheckpointFacts(
        stop_token_ids=stop_token_ids(side, rules),
        block_size=size,
        block_size_source=source,
        mask_token_id=mask,
        generation_defaults=generation_defaults(side, generation_config),
        mask_text=rules.mask_tokens[0],
        mask_from_family=mask is not None and mask == rules.published_mask_id and not named,
    )


def model_info(
    family: str,
    facts: CheckpointFacts,
    config: dict[str, Any],
    *,
    mask_token_id: int,
    vocab_size: int,
    max_length: int = 32768,
    shifted: bool = False,
    prefill_bias: bool = False,
) -> ModelInfo:
    """The :class:`ModelInfo` of a loaded checkpoint: its facts plus what the family read from the config
    (``max_length``: the positions it accepts where the config gives no ``max_position_embeddings``)."""
    return ModelInfo(
        family=family,
        mask_token_id=mask_token_id,
        eos_token_ids=list(facts.stop_token_ids),
        vocab_size=vocab_size,
        max_length=int(config.get("max_position_embeddings") or max_length),
        default_block_size=facts.block_size,
        block_size_source=facts.block_size_source,
        generation_defaults=dict(facts.generation_defaults),
        shifted=shifted,
        pad_token_id=config.get("pad_token_id"),
        bos_token_id=config.get("bos_token_id"),
        prefill_bias=prefill_bias,
    )

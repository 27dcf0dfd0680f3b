"""Presets: the named ones (:data:`PRESETS`), and preset files, a tuned (or hand-written) set of decoding
settings saved as JSON.

Format (what ``s2d2 tune`` writes, and what ``--preset PATH.json`` and a checkpoint's
``s2d2_preset.json`` hold)::

    {"name": "tuned-tiny-gsm",
     "settings": {"decoder": "s2d2", "block_size": 8, ...},   # DecodeConfig field names
     "tuned_on": {"model": ..., "task": ..., "split": ..., "n": ..., ...},
     "dev": {"accuracy": ..., "nfe_per_token": ..., ...},
     "ar": {"accuracy": ..., "nfe_per_token": ..., ...}}

Only ``settings`` is required; ``name`` defaults to the file's stem. Any other top-level key or malformed
JSON is a one-line :class:`~s2d2.errors.ConfigError` naming the file. This module parses the format only:
the settings themselves are checked in one place, :func:`s2d2.config.checked_preset_file` (which
``--preset FILE`` and a checkpoint's preset go through), as they are settings.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .files import json_object, write_text_atomically

#: Top-level keys a preset file may hold.
PRESET_FILE_KEYS = ("name", "settings", "tuned_on", "dev", "ar")
#: The file a checkpoint directory may hold: the model's default decoding settings.
MODEL_PRESET_FILE = "s2d2_preset.json"


@dataclass
class PresetFile:
    """A preset read from (or to be written to) a JSON file."""

    name: str
    settings: dict[str, Any]
    tuned_on: dict[str, Any] | None = None
    dev: dict[str, Any] | None = None
    ar: dict[str, Any] | None = None
    path: Path | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "settings": self.settings}
        for key in ("tuned_on", "dev", "ar"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def looks_like_preset_file(preset: str) -> bool:
    """Whether a ``preset`` value names a file: it ends in ``.json`` or is an existing file."""
    return preset.endswith(".json") or Path(preset).expanduser().is_file()


#: Parsed files by (resolved path, mtime, size): ``make_config`` runs once per request of a batch.
_CACHE: dict[tuple[str, int, int], PresetFile] = {}


def read_preset_file(path: str | os.PathLike[str]) -> PresetFile:
    """Read a preset file's format (not its settings' values); a problem is one ``ConfigError`` line
    naming the file."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise ConfigError(f"preset file {p}: {reason}") from None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE.clear()  # one live entry per file in practice; keep the cache tiny
        _CACHE[key] = _parse(p)
    cached = _CACHE[key]
    return dataclasses.replace(cached, settings=dict(cached.settings))


def _parse(p: Path) -> PresetFile:
    def fail(reason: str) -> ConfigError:
        return ConfigError(f"preset file {p}: {reason}")

    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or str(exc))
        raise fail(reason) from None
    try:
        obj = json_object(text)
    except ValueError as exc:
        raise fail(str(exc)) from None
    unknown = [k for k in obj if k not in PRESET_FILE_KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r}; a preset file holds: {', '.join(PRESET_FILE_KEYS)}")
    if "settings" not in obj:
        raise fail('missing key "settings"')
    settings = obj["settings"]
    if not isinstance(settings, dict):
        raise fail('"settings" must be a JSON object of decoding settings')
    name = obj.get("name", p.stem)
    if not isinstance(name, str) or not name:
        raise fail('"name" must be a non-empty string')
    for key in ("tuned_on", "dev", "ar"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise fail(f'"{key}" must be a JSON object')
    return PresetFile(name, dict(settings), obj.get("tuned_on"), obj.get("dev"), obj.get("ar"), path=p)


def write_preset_file(preset: PresetFile, path: str | os.PathLike[str]) -> Path:
    """Write ``preset`` as indented JSON (through a temporary file, so a reader never sees half of it)."""
    return write_text_atomically(path, json.dumps(preset.to_json(), indent=2) + "\n")


_SDAR: dict[str, Any] = dict(
    decoder="s2d2", fallback="dynamic", threshold=0.85, causal_cache=True, last_block="full"
)
_FAST_DLLM_V2: dict[str, Any] = dict(
    decoder="s2d2", block_size=32, steps=None, threshold=0.9, fallback="dynamic", last_block="full"
)
_FAST_DLLM_V2_HYSTERESIS: dict[str, Any] = dict(
    policy="hysteresis", score="dynamic", penalty=1.0, hysteresis_on=1.0, hysteresis_off=-5.0
)
_LLADA2: dict[str, Any] = dict(
    decoder="s2d2",
    block_size=32,
    steps=None,
    fallback="dynamic",
    policy="score",
    score="static",
    penalty=4.0,
    last_block="full",
)

_LOSSLESS: dict[str, Any] = dict(
    decoder="s2d2",
    steps=None,
    policy="always",
    acceptance="auto",
    fallback="static",
    causal_cache=True,
    temperature=0.0,
)

#: Named presets: partial settings applied before the user's own. The paper presets decode the last block
#: whole (``last_block="full"``), as the families' reference decoders that produced the paper's figures do.
PRESETS: dict[str, dict[str, Any]] = {
    # SDAR-8B, B=4: score threshold 0 with a static penalty c=1, soft-entropy estimator.
    "paper-sdar-a": dict(
        _SDAR,
        block_size=4,
        steps=4,
        policy="score",
        score="static",
        penalty=1.0,
        score_threshold=0.0,
        estimator="soft-entropy",
    ),
    # SDAR-8B, B=16: verify on every step.
    "paper-sdar-b": dict(_SDAR, block_size=16, steps=16, policy="always"),
    # Fast-dLLM v2 7B (block 32, tau 0.9): sub-blocks of 4 or 16 with hysteresis routing (on 1, off -5,
    # dynamic score, c = 1); whole 32-token sub-blocks with a minimum span of 8.
    "paper-fast-dllm-v2-sub4": dict(_FAST_DLLM_V2, sub_block_size=4, **_FAST_DLLM_V2_HYSTERESIS),
    "paper-fast-dllm-v2-sub16": dict(_FAST_DLLM_V2, sub_block_size=16, **_FAST_DLLM_V2_HYSTERESIS),
    "paper-fast-dllm-v2-sub32": dict(_FAST_DLLM_V2, sub_block_size=32, policy="min-span", min_span=8),
    # LLaDA2.1-Mini (block 32) with token editing: conservative (mask tau 0.95, edit tau 0.9, score
    # threshold -5) and quality (mask tau 0.7, edit tau 0.5, score threshold 0); static score, c = 4.
    "paper-llada2-conservative": dict(_LLADA2, threshold=0.95, editing_threshold=0.9, score_threshold=-5.0),
    "paper-llada2-quality": dict(_LLADA2, threshold=0.7, editing_threshold=0.5, score_threshold=0.0),
    # Output equals AR greedy decoding token for token, at any block size.
    "lossless": _LOSSLESS,
    # The same output in about one forward per step: verification forwards carry the next step's drafts.
    "lossless-fused": dict(_LOSSLESS, fuse=True, predraft_positions=4, predraft_tokens=0),
    # The same output again; the engine's planner chooses each step's verification by its cost.
    "lossless-auto": dict(
        _LOSSLESS,
        fuse=True,
        predraft_positions=4,
        predraft_tokens=0,
        plan="auto",
        plan_block_sizes=(4, 8, 16),
    ),
}


__all__ = [
    "MODEL_PRESET_FILE",
    "PRESETS",
    "PRESET_FILE_KEYS",
    "PresetFile",
    "looks_like_preset_file",
    "read_preset_file",
    "write_preset_file",
]

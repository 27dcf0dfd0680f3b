"""Preset files: a tuned (or hand-written) set of decoding settings saved as JSON.

Format (what ``s2d2 tune`` writes, and what ``--preset PATH.json`` and a checkpoint's
``s2d2_preset.json`` hold)::

    {"name": "tuned-tiny-gsm",
     "settings": {"decoder": "s2d2", "block_size": 8, ...},   # DecodeConfig field names
     "tuned_on": {"model": ..., "task": ..., "split": ..., "n": ..., ...},
     "dev": {"accuracy": ..., "nfe_per_token": ..., ...},
     "ar": {"accuracy": ..., "nfe_per_token": ..., ...}}

Only ``settings`` is required; ``name`` defaults to the file's stem. Any other top-level key, an unknown
setting name, invalid setting values or malformed JSON is a one-line :class:`~s2d2.errors.ConfigError`
naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import write_text_atomically

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
    """Read and check a preset file; any problem is one ``ConfigError`` line naming the file."""
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
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
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
    _check_settings(settings, fail)
    return PresetFile(name, dict(settings), obj.get("tuned_on"), obj.get("dev"), obj.get("ar"), path=p)


def _check_settings(settings: dict[str, Any], fail: Any) -> None:
    """Every name must be a decoding setting, and the settings must be valid on their own."""
    from ..config import DecodeConfig

    names = {f.name for f in dataclasses.fields(DecodeConfig)}
    for key in settings:
        if key not in names:
            raise fail(f'unknown decoding setting {key!r} in "settings"')
    try:
        DecodeConfig.build(**{k: v for k, v in settings.items() if v is not None})
    except ConfigError as exc:
        raise fail(f"invalid settings: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise fail(f"invalid settings: {exc}") from None


def write_preset_file(preset: PresetFile, path: str | os.PathLike[str]) -> Path:
    """Write ``preset`` as indented JSON (through a temporary file, so a reader never sees half of it)."""
    return write_text_atomically(path, json.dumps(preset.to_json(), indent=2) + "\n")


__all__ = [
    "MODEL_PRESET_FILE",
    "PRESET_FILE_KEYS",
    "PresetFile",
    "looks_like_preset_file",
    "read_preset_file",
    "write_preset_file",
]

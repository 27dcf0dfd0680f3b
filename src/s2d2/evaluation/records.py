"""Where an evaluation's problems come from: a local JSONL file (``--data``) or, only when none is given,
a dataset on the Hugging Face hub (through ``datasets``, if installed); one-line errors for bad files."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from ..errors import S2D2Error

__all__ = ["hub_records", "read_jsonl", "require_fields"]


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file (``.jsonl`` or ``.jsonl.gz``) with a one-line error for a bad file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise S2D2Error(f"data file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    records: list[dict] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise S2D2Error(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise S2D2Error(f"{path}:{lineno}: expected a JSON object per line")
                records.append(rec)
    except (OSError, UnicodeDecodeError) as exc:
        raise S2D2Error(f"cannot read {path}: {exc}") from None
    return records


def require_fields(records: list[dict], fields: tuple[str, ...], source: str) -> None:
    """Every record has every one of ``fields``; else a one-line error naming the first that lacks some."""
    for i, rec in enumerate(records):
        missing = [f for f in fields if f not in rec]
        if missing:
            raise S2D2Error(
                f"{source}: record {i + 1} lacks field(s) {', '.join(missing)} (expected {', '.join(fields)})"
            )


def hub_records(task: str, path: str, name: str | None, split: str) -> list[dict]:
    """``split`` of a hub dataset through ``datasets`` (only when the user gave no --data)."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise S2D2Error(
            f"no data for {task}: pass --data FILE.jsonl (or install 'datasets' to fetch {path} from the hub)"
        ) from None
    from datasets import load_dataset

    print(
        f"loading {path} ({split}) from the Hugging Face hub; pass --data FILE.jsonl to use a local file",
        file=sys.stderr,
    )
    try:
        ds = load_dataset(path, name, split=split) if name else load_dataset(path, split=split)
    except Exception as exc:  # network, auth, cache: the user needs one line and the way out
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise S2D2Error(f"cannot load {path} from the hub ({first}); pass --data FILE.jsonl") from None
    return [dict(r) for r in ds]

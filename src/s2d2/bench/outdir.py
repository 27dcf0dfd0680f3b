"""A bench output directory: the files of ours there, and the checks before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import S2D2Error

#: Files of ours in an output directory; nothing else there is ever written.
OUTPUT_FILES = ("results.json", "problems.jsonl", "table.md", "accuracy_vs_nfe.png", "accuracy_vs_wall.png")


def check_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a path, if we may write our files there (it need not exist yet); creates nothing."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise S2D2Error(f"output path {out} exists and is not a directory")
    for name in OUTPUT_FILES:
        if (out / name).exists() and not (out / name).is_file():
            raise S2D2Error(f"{out / name} exists and is not a file; choose another output directory")
    return out


def prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """:func:`check_out_dir`, then create the directory (and its parents) if it does not exist."""
    out = check_out_dir(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise S2D2Error(f"cannot create output directory {out}: {exc.strerror or exc}") from None
    return out

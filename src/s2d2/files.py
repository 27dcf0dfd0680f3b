"""Writing a file so that no reader ever sees half of it and a failed write leaves the old file alone;
reading a file's text (or one line of it) as one JSON object."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import S2D2Error

__all__ = ["json_object", "write_text_atomically"]


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then move it over ``path``.

    The file gets the permission bits ``path`` already has, or those a new file gets under the umask
    (not the owner-only ones of a temporary file). Any failure is a one-line ``S2D2Error``; the
    temporary file is removed and an existing ``path`` is left as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise S2D2Error(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise S2D2Error(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return path


def json_object(text: str | bytes, *, one_line: bool = False) -> dict[str, Any]:
    """``text`` parsed as one JSON object; ``ValueError`` with the reason (where the JSON breaks: its line
    and column, or its column alone for ``one_line`` text) when it is not one."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if one_line else f"line {exc.lineno} column {exc.colno}"
        raise ValueError(f"not valid JSON ({exc.msg} at {where})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _file_mode(path: Path) -> int:
    """The permission bits ``path`` has, or those a new file gets under the current umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask

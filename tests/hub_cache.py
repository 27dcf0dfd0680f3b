"""A Hugging Face Hub cache laid out on disk as ``huggingface_hub`` writes it, for offline tests.

``models--ORG--NAME/blobs/<etag>`` holds each file once; ``snapshots/<commit>/<path>`` are relative
symlinks into ``blobs``; ``refs/<branch>`` holds the commit a branch points to (no newline). The library
itself then reads it (``HF_HUB_OFFLINE=1`` with ``HF_HOME`` or ``HF_HUB_CACHE`` pointing here): nothing
of it is mocked.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def _etag(data: bytes, name: str) -> str:
    """The blob name the library uses: an LFS file's sha256, a regular file's git blob sha1."""
    if name.endswith(".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_snapshot(cache: Path, repo_id: str, source: Path, *, branch: str | None = "main") -> str:
    """Put the files of the directory ``source`` into ``cache`` as a snapshot of the model repository
    ``repo_id``; ``branch`` (if any) then points to it. Returns the snapshot's commit hash."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in source.rglob("*") if p.is_file())
    commit = hashlib.sha1(repo_id.encode() + b"".join(p.read_bytes() for p in files)).hexdigest()
    for f in files:
        data = f.read_bytes()
        rel = f.relative_to(source)
        blob = repo / "blobs" / _etag(data, f.name)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    if branch is not None:
        ref = repo / "refs" / branch
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return commit


def offline_env(hf_home: Path) -> dict[str, str]:
    """This process's environment with the Hub offline and its cache under ``hf_home`` (``hf_home/hub``,
    where the library puts it for ``HF_HOME``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return env

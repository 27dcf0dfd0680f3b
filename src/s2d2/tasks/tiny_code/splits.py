"""The ``tiny-code`` splits: ``test`` and ``dev`` committed as JSONL, ``train`` an endless stream.

``test`` (:data:`SPLIT_SIZES`) and ``dev`` are drawn from their own seeds (:data:`SPLIT_SEEDS`), unique by
prompt; dev excludes every test prompt, and the training stream (:func:`iter_train_problems`) excludes
both, so no test or dev function is ever trained on. Prompts are told apart by :func:`question_hash`.
Files: ``s2d2/data/tiny_code/{test,dev}.jsonl`` (:func:`data_dir`, :func:`write_split_files`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from .problems import generate_problem

__all__ = [
    "SPLIT_SEEDS",
    "SPLIT_SIZES",
    "data_dir",
    "heldout_questions",
    "iter_train_problems",
    "load_split",
    "question_hash",
    "write_split_files",
]

SPLIT_SEEDS = {"test": 20270001, "dev": 20270002}
SPLIT_SIZES = {"test": 500, "dev": 500}
_FIELDS = ("id", "kind", "question", "answer", "entry_point", "tests")
_CACHE: dict[str, list[dict]] = {}


def question_hash(question: str) -> str:
    """A prompt's identity across splits: the first 16 hex digits of its SHA-1."""
    return hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]


def data_dir() -> Path:
    """Directory of the committed files, ``s2d2/data/tiny_code``."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "data" / "tiny_code"


def _generate_unique(n: int, seed: int, exclude: set[str], prefix: str) -> list[dict]:
    rng, seen, out = random.Random(seed), set(exclude), []
    while len(out) < n:
        prob = generate_problem(rng)
        h = question_hash(prob["question"])
        if h not in seen:
            seen.add(h)
            out.append({"id": f"{prefix}-{len(out):05d}", **prob})
    return out


def _generated(name: str) -> list[dict]:
    exclude = {question_hash(p["question"]) for p in _split("test")} if name == "dev" else set()
    return _generate_unique(SPLIT_SIZES[name], SPLIT_SEEDS[name], exclude, name)


def _split(name: str) -> list[dict]:
    """The committed split (its file if present, else regenerated identically)."""
    if name not in _CACHE:
        path = data_dir() / f"{name}.jsonl"
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                _CACHE[name] = [json.loads(line) for line in f if line.strip()]
        else:
            _CACHE[name] = _generated(name)
    return _CACHE[name]


def load_split(name: str, n: int | None = None) -> list[dict]:
    """The first ``n`` (all when None) problems of ``test`` or ``dev``; ``ValueError`` for another name."""
    if name not in SPLIT_SEEDS:
        raise ValueError(f"unknown tiny-code split {name!r}; expected test or dev")
    probs = _split(name)
    return probs if n is None else probs[:n]


def heldout_questions() -> set[str]:
    """Hashes of every test and dev prompt (the training stream never yields these)."""
    return {question_hash(p["question"]) for name in SPLIT_SEEDS for p in _split(name)}


def iter_train_problems(seed: int, start: int = 0, hard_focus: float = 0.0) -> Iterator[dict]:
    """An endless stream of training problems for ``seed``, skipping held-out prompts; problem ``i``
    depends only on ``(seed, i // 4096)``, so a resumed run restarts at ``start`` cheaply.
    ``hard_focus`` is accepted for the training loop's sake and must be 0 (no curriculum here)."""
    if hard_focus:
        raise ValueError("tiny-code has no hard-focus curriculum: hard_focus must be 0")
    held = heldout_questions()
    chunk, skip = divmod(start, 4096)
    while True:
        rng = random.Random(f"tiny-code-train-{seed}-{chunk}")
        for i in range(4096):
            prob = generate_problem(rng)
            if i >= skip and question_hash(prob["question"]) not in held:
                yield prob
        skip = 0
        chunk += 1


def write_split_files(directory: Path | None = None) -> None:
    """(Re)write ``test.jsonl`` and ``dev.jsonl`` from the default seeds."""
    directory = data_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _CACHE.clear()
    for name in ("test", "dev"):
        probs = _generated(name)
        _CACHE[name] = probs
        with open(directory / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for p in probs:
                f.write(json.dumps({k: p[k] for k in _FIELDS}) + "\n")

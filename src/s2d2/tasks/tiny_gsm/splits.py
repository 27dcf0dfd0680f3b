"""The ``tiny-gsm`` splits: their seeds and sizes, the held-out questions, and the committed files.

``test`` and ``dev`` are committed as JSONL files (``s2d2/data/tiny_gsm/{test,dev}.jsonl``, found next
to this package, see :func:`data_dir`): the test split is the start of a reserved pool of
:data:`RESERVED_TEST` questions, and dev excludes the whole pool. ``train`` is generated on the fly
(:func:`make_split`; the endless stream is :func:`s2d2.tasks.tiny_gsm.curriculum.iter_train_problems`)
and excludes both. Questions are told apart by :func:`question_hash`.
"""

from __future__ import annotations

import hashlib
import json
import random
from importlib import resources
from pathlib import Path

from .problems import generate_problem

__all__ = [
    "RESERVED_TEST",
    "SPLIT_SEEDS",
    "SPLIT_SIZES",
    "data_dir",
    "heldout_questions",
    "load_split",
    "make_split",
    "question_hash",
    "write_split_files",
]

SPLIT_SEEDS = {"test": 20260001, "dev": 20260002, "train": 20260003}
SPLIT_SIZES = {"test": 500, "dev": 1000}
#: Questions reserved for testing: the first RESERVED_TEST problems of the test seed. The committed test
#: split is their first SPLIT_SIZES["test"]; dev and train exclude all of them, so the test split can grow
#: up to this size without touching dev or train.
RESERVED_TEST = 1000


def question_hash(question: str) -> str:
    """A question's identity across splits: the first 16 hex digits of its SHA-1."""
    return hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]


def _generate_unique(n: int, seed: int, exclude: set[str], prefix: str) -> list[dict]:
    rng = random.Random(seed)
    seen = set(exclude)
    out: list[dict] = []
    while len(out) < n:
        prob = generate_problem(rng)
        h = question_hash(prob["question"])
        if h in seen:
            continue
        seen.add(h)
        out.append({"id": f"{prefix}-{len(out):05d}", **prob})
    return out


def make_split(name: str, n: int, seed: int | None = None) -> list[dict]:
    """Generate split ``name`` ("train" | "dev" | "test") with ``n`` unique problems from ``seed``.

    The default seeds (:data:`SPLIT_SEEDS`) reproduce the committed files. Dev excludes the (generated)
    1000 test questions; train excludes the test and dev questions.
    """
    if name not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {name!r}; expected train, dev or test")
    seed = SPLIT_SEEDS[name] if seed is None else seed
    exclude: set[str] = set()
    if name in ("dev", "train"):
        exclude |= _reserved_test_hashes()
    if name == "train":
        exclude |= {question_hash(p["question"]) for p in _default_split("dev")}
    return _generate_unique(n, seed, exclude, name)


_CACHE: dict[str, list[dict]] = {}


def _default_split(name: str) -> list[dict]:
    """The committed split (from its file if present, else regenerated identically)."""
    if name not in _CACHE:
        path = data_dir() / f"{name}.jsonl"
        if path.is_file():
            _CACHE[name] = _read_jsonl(path)
        else:
            exclude: set[str] = set()
            if name == "dev":
                exclude = _reserved_test_hashes()
            _CACHE[name] = _generate_unique(SPLIT_SIZES[name], SPLIT_SEEDS[name], exclude, name)
    return _CACHE[name]


def heldout_questions() -> set[str]:
    """Hashes of every test and dev question (the train stream never yields these)."""
    return _reserved_test_hashes() | {question_hash(p["question"]) for p in _default_split("dev")}


_RESERVED: set[str] = set()


def _reserved_test_hashes() -> set[str]:
    """Hashes of the reserved test questions (a superset of the committed test split)."""
    if not _RESERVED:
        pool = _generate_unique(RESERVED_TEST, SPLIT_SEEDS["test"], set(), "test")
        _RESERVED.update(question_hash(p["question"]) for p in pool)
    return _RESERVED


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data_dir() -> Path:
    """Directory of the committed tiny-gsm files: ``s2d2/data/tiny_gsm``, found relative to this package
    (``importlib.resources`` on the regular package ``s2d2.tasks``, then its parent directory)."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "data" / "tiny_gsm"


def load_split(name: str, n: int | None = None) -> list[dict]:
    """Load split ``name``: test/dev from the committed JSONL files, train generated on the fly.

    ``n`` limits the number of problems (the first ``n``); for train it is required.
    """
    if name in ("test", "dev"):
        path = data_dir() / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"tiny-gsm {name} split not found at {path}")
        probs = _read_jsonl(path)
        return probs if n is None else probs[:n]
    if name == "train":
        if n is None:
            raise ValueError("load_split('train') needs n (the train split is generated on the fly)")
        return make_split("train", n)
    raise ValueError(f"unknown split {name!r}; expected train, dev or test")


def write_split_files(directory: Path | None = None) -> None:
    """(Re)write ``test.jsonl`` and ``dev.jsonl`` from the default seeds."""
    directory = data_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _CACHE.clear()
    test = _generate_unique(SPLIT_SIZES["test"], SPLIT_SEEDS["test"], set(), "test")
    dev = _generate_unique(SPLIT_SIZES["dev"], SPLIT_SEEDS["dev"], _reserved_test_hashes(), "dev")
    for name, probs in (("test", test), ("dev", dev)):
        with open(directory / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for p in probs:
                f.write(json.dumps({k: p[k] for k in ("id", "question", "answer", "final")}) + "\n")
    _CACHE.clear()

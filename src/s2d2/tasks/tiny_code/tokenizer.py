"""The ``tiny-code`` tokenizer: word-level and layout-aware, so decoded text is exactly the Python written.

Pieces (:data:`PIECE_PATTERN`): a newline with the spaces that indent the next line (``"\\n        "``),
an identifier or word with the one space before it (``" return"``, ``"xs"``), a single digit with or
without its space, an operator of up to three characters with or without its space, one other character,
or a run of spaces. The decoder concatenates the pieces (``tokenizers``' ``Fuse``), so
``decode(encode(text)) == text`` for every text of the task's vocabulary; a piece outside it is
``<unk>``. The vocabulary is every piece of a fixed sample of generated problems plus every digit and
operator in both forms (:func:`vocabulary`), so it never depends on a split.

:func:`build_tokenizer` builds it; the committed copy is the built-in model's own, in
:func:`tokenizer_dir` (its files: :data:`TOKENIZER_FILES`).
"""

from __future__ import annotations

import random
import re
from importlib import resources
from pathlib import Path

from ..fast_tokenizer import wrap_fast
from .problems import generate_problem

__all__ = [
    "PIECE_PATTERN",
    "SPECIAL_TOKENS",
    "TOKENIZER_FILES",
    "build_tokenizer",
    "pieces",
    "tokenizer_dir",
    "vocabulary",
]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SPECIAL_TOKENS = ["<pad>", "<eos>", "<mask>", "<unk>", "<bos>"]
_OPERATORS = ["**", "//=", "//", "==", "!=", "<=", ">=", "+=", "-=", "*=", "%=", "->", '"""']
PIECE_PATTERN = (
    r"\n *| ?[A-Za-z_][A-Za-z_]*| ?[0-9]| ?(?:"
    + "|".join(re.escape(o) for o in _OPERATORS)
    + r")| ?[^\sA-Za-z_0-9]| +"
)
_PIECE = re.compile(PIECE_PATTERN)
#: problems drawn (from a fixed seed) to collect the vocabulary's words
_VOCAB_SAMPLE = 20000


def tokenizer_dir() -> Path:
    """Directory of the committed tiny-code tokenizer: the built-in model's own, ``s2d2/models/tiny-code``."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "models" / "tiny-code"


def pieces(text: str) -> list[str]:
    """``text`` cut into the tokenizer's pieces (the same cuts the ``tokenizers`` pre-tokenizer makes)."""
    return _PIECE.findall(text)


def vocabulary() -> list[str]:
    """The vocabulary after the special tokens: digits, operators and punctuation in both forms, then the
    pieces of :data:`_VOCAB_SAMPLE` problems drawn from a fixed seed, in sorted order."""
    fixed = [str(d) for d in range(10)] + _OPERATORS + list("()[]{}:,.'=<>+-*/%;!")
    fixed += ["\n" + " " * (4 * i) for i in range(5)] + [" "]
    words = set(fixed) | {" " + p for p in fixed if not p.startswith("\n") and p != " "}
    rng = random.Random("tiny-code-vocabulary")
    for _ in range(_VOCAB_SAMPLE):
        p = generate_problem(rng)
        words.update(pieces(p["question"] + p["answer"]))
    return sorted(words)


def build_tokenizer(directory: Path | None = None):
    """Build the tiny-code tokenizer (``tokenizers`` WordLevel, regex pre-tokenizer, fusing decoder) and,
    if ``directory``, save it there. Returns a ``transformers.PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return wrap_fast(tok, directory)

"""The ``tiny-gsm`` tokenizer: whole words of the stories, single digits and punctuation marks.

:func:`build_tokenizer` builds it (a ``tokenizers`` WordPiece in a ``transformers`` fast tokenizer); the
committed copy is the built-in model's own, in :func:`tokenizer_dir` (its files: :data:`TOKENIZER_FILES`).
A number is split into digits, each after the first with the continuation prefix :data:`CONT`
(``24`` -> ``2 @@4``).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from ..fast_tokenizer import wrap_fast
from .templates import (
    CONTAINERS,
    GROUPS,
    NAMES_F,
    NAMES_M,
    OBJECTS,
    PEOPLE,
    TEMPLATE_GROUPS,
    capitalize_first,
)

__all__ = ["CONT", "PUNCT", "SPECIAL_TOKENS", "TOKENIZER_FILES", "build_tokenizer", "tokenizer_dir"]

#: The tiny-gsm tokenizer's files in :func:`tokenizer_dir` (what ``build_tokenizer(directory)`` writes).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

SPECIAL_TOKENS = ["<pad>", "<eos>", "<mask>", "<unk>", "<bos>"]
# Continuation prefix of digits inside a number ("24" -> "2 @@4"); not "##", which would eat "####".
CONT = "@@"
PUNCT = [".", ",", "?", "!", "*", "/", "+", "-", "=", "####", ":", "'"]


def tokenizer_dir() -> Path:
    """Directory of the committed tiny-gsm tokenizer: the built-in model's own, ``s2d2/models/tiny-gsm``
    (its files: :data:`TOKENIZER_FILES`; the directory also holds the model's weights and config)."""
    return Path(str(resources.files("s2d2.tasks"))).parent / "models" / "tiny-gsm"


def _template_words() -> set[str]:
    words: set[str] = set()
    texts = [t for group in TEMPLATE_GROUPS for t in group]
    texts += NAMES_F + NAMES_M + OBJECTS + CONTAINERS + GROUPS + PEOPLE + ["she", "he", "her", "him"]
    for t in texts:
        t = re.sub(r"\{[a-z0-9]+\}", " ", t)
        for w in re.findall(r"[A-Za-z]+", t):
            words.add(w)
            words.add(capitalize_first(w))
            words.add(w.lower())
    return words


def build_tokenizer(directory: Path | None = None):
    """Build the tiny-gsm tokenizer (a ``tokenizers`` WordPiece) and, if ``directory``, save it there.

    Returns a ``transformers.PreTrainedTokenizerFast``. Saved files load with ``AutoTokenizer``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab_list = list(SPECIAL_TOKENS)
    vocab_list += [str(d) for d in range(10)] + [f"{CONT}{d}" for d in range(10)]
    vocab_list += PUNCT
    vocab_list += sorted(_template_words())
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    tok = Tokenizer(
        models.WordPiece(
            vocab=vocab, unk_token="<unk>", continuing_subword_prefix=CONT, max_input_chars_per_word=100
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix=CONT, cleanup=True)
    return wrap_fast(tok, directory)

"""The built-in tasks' tokenizers wrapped for ``transformers``: one place for their special tokens."""

from __future__ import annotations

from pathlib import Path


def wrap_fast(tok, directory: Path | None = None):
    """``tok`` (a ``tokenizers.Tokenizer`` whose vocabulary holds ``<pad> <eos> <mask> <unk> <bos>``) as a
    ``transformers.PreTrainedTokenizerFast`` with those special tokens (no clean-up of spaces, 512
    positions); saved to ``directory`` when given. Returns the fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        mask_token="<mask>",
        unk_token="<unk>",
        bos_token="<bos>",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    if directory is not None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(directory))
    return fast

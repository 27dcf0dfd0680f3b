"""Decode traces people can look at: :mod:`.view` (the layout), :mod:`.render_terminal` (rich) and
:mod:`.render_html` (one self-contained HTML page)."""

from .view import KINDS, TraceView, build_view, commit_counts

__all__ = ["KINDS", "TraceView", "build_view", "commit_counts", "view_of"]


def view_of(model, prompt_ids, result, prompt_text: str = "") -> TraceView:
    """The view of one traced generation (``model.generate(..., trace=True)``) of ``model``."""
    tok = getattr(model, "tokenizer", None)

    def text(i: int) -> str:
        if tok is None:
            return str(i)
        piece = tok.convert_ids_to_tokens(int(i))
        return piece if isinstance(piece, str) and piece else str(i)

    return build_view(
        result.trace or [],
        list(prompt_ids),
        result.config.block_size,
        text,
        stats=result.stats,
        prompt_text=prompt_text,
        output_text=result.text,
    )

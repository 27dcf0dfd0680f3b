"""``s2d2 trace``: decode one prompt and show what the decoder did, step by step (terminal, HTML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import (
    DecodingFlags,
    DeviceFlags,
    GenerationConfigOpt,
    ModelOpt,
    PromptChatOpt,
    RevisionOpt,
    SetOpt,
    load_model,
    option_groups,
)

PromptArg = Annotated[str, typer.Argument(help="Prompt text.", show_default=False)]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write a self-contained HTML page with a step slider.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No terminal view (with --html).")]


@option_groups
def trace_command(
    prompt: PromptArg,
    model: ModelOpt = "tiny-gsm",
    *,
    decoding: DecodingFlags,
    chat: PromptChatOpt = False,
    html: HtmlOpt = None,
    quiet: QuietOpt = False,
    placement: DeviceFlags,
    sets: SetOpt = None,
    revision: RevisionOpt = None,
    generation_config: GenerationConfigOpt = "auto",
) -> None:
    """Decode PROMPT with the given settings and show every step of every block: the block's tokens
    coloured by how they were committed (accepted draft, AR correction or resample, fallback commit,
    edit), the forward's kind and the running NFE, then a summary. --html FILE writes the same view as
    one self-contained page (no network) with a step slider and per-token probabilities on hover."""
    from ..tracing import view_of

    settings = decoding.settings(sets)
    settings["trace"] = True
    m = load_model(model, placement, max_num_seqs=1, revision=revision, generation_config=generation_config)
    cfg = m.make_config(**settings)
    ids = m.encode(prompt, chat=chat)
    result = m.generate(ids, cfg)
    view = view_of(m, ids, result, prompt_text=prompt)
    if not quiet:
        from ..tracing.render_terminal import print_trace

        print_trace(view)
    if html is not None:
        from ..tracing.render_html import write_html

        write_html(view, html, title=f"s2d2 trace: {model}")
        typer.echo(f"wrote {html}", err=True)

"""``s2d2 trace``: decode one prompt and show what the decoder did, step by step (terminal, HTML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import (
    BlockOpt,
    DecoderOpt,
    DeviceOpt,
    DtypeOpt,
    EstimatorOpt,
    GenerationConfigOpt,
    MaxNewOpt,
    ModelOpt,
    PolicyOpt,
    PresetOpt,
    RevisionOpt,
    SeedOpt,
    SetOpt,
    StepsOpt,
    TempOpt,
    ThresholdOpt,
    TopKOpt,
    TopPOpt,
    decoding_settings,
)

PromptArg = Annotated[str, typer.Argument(help="Prompt text.", show_default=False)]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write a self-contained HTML page with a step slider.")
]
ChatOpt = Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No terminal view (with --html).")]


def trace_command(
    prompt: PromptArg,
    model: ModelOpt = "tiny-gsm",
    decoder: DecoderOpt = None,
    preset: PresetOpt = None,
    block_size: BlockOpt = None,
    steps: StepsOpt = None,
    threshold: ThresholdOpt = None,
    policy: PolicyOpt = None,
    estimator: EstimatorOpt = None,
    max_new_tokens: MaxNewOpt = None,
    temperature: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    seed: SeedOpt = None,
    chat: ChatOpt = False,
    html: HtmlOpt = None,
    quiet: QuietOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    sets: SetOpt = None,
    revision: RevisionOpt = None,
    generation_config: GenerationConfigOpt = "auto",
) -> None:
    """Decode PROMPT with the given settings and show every step of every block: the block's tokens
    coloured by how they were committed (accepted draft, AR correction or resample, fallback commit,
    edit), the forward's kind and the running NFE, then a summary. --html FILE writes the same view as
    one self-contained page (no network) with a step slider and per-token probabilities on hover."""
    from ..model import load
    from ..tracing import view_of

    settings = decoding_settings(
        decoder=decoder, preset=preset, block_size=block_size, steps=steps, threshold=threshold,
        policy=policy, estimator=estimator, max_new_tokens=max_new_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, sets=sets,
    )  # fmt: skip
    settings["trace"] = True
    m = load(model, device=device, dtype=dtype, max_num_seqs=1, revision=revision,
             generation_config=generation_config)  # fmt: skip
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

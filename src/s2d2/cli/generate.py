"""``s2d2 generate``: one continuation of a prompt, as text or as JSON with ids and statistics."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..errors import S2D2Error
from .options import (
    BlockOpt,
    DecoderOpt,
    DeviceOpt,
    DtypeOpt,
    EstimatorOpt,
    MaxNewOpt,
    ModelOpt,
    PolicyOpt,
    PresetOpt,
    SeedOpt,
    SetOpt,
    StepsOpt,
    TempOpt,
    ThresholdOpt,
    TopKOpt,
    TopPOpt,
    decoding_settings,
)

PromptArg = Annotated[str, typer.Argument(help="Prompt text (or token ids with --ids).")]
ChatOpt = Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object with text, ids and stats.")]
IdsOpt = Annotated[bool, typer.Option("--ids", help="PROMPT is token ids separated by spaces or commas.")]
TraceOpt = Annotated[bool, typer.Option(help="Include the per-step trace (with --json).")]


def generate_command(
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
    as_json: JsonOpt = False,
    ids: IdsOpt = False,
    trace: TraceOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    sets: SetOpt = None,
) -> None:
    """Generate a continuation of PROMPT and print it (with --json: text, token ids and statistics)."""
    from ..model import load

    settings = decoding_settings(
        decoder=decoder,
        preset=preset,
        block_size=block_size,
        steps=steps,
        threshold=threshold,
        policy=policy,
        estimator=estimator,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        sets=sets,
    )
    if trace:
        settings["trace"] = True
    m = load(model, device=device, dtype=dtype)
    cfg = m.make_config(**settings)  # validate settings before any work
    prompt_in = _prompt_input(prompt, ids=ids or m.tokenizer is None, ids_flag=ids, model=model)
    result = m.generate(prompt_in, cfg, chat=chat)
    _print_result(result, as_json=as_json, trace=trace)


def _prompt_input(prompt: str, *, ids: bool, ids_flag: bool, model: str) -> Any:
    """The prompt as given, or as token ids where ``ids`` (``--ids``, or a model without a tokenizer)."""
    if not ids:
        return prompt
    try:
        return [int(t) for t in prompt.replace(",", " ").split()]
    except ValueError:
        raise S2D2Error(
            "PROMPT must be token ids (e.g. '17 42 101')"
            + ("" if ids_flag else f": model {model} has no tokenizer")
        ) from None


def _print_result(result: Any, *, as_json: bool, trace: bool) -> None:
    """``--json``: one JSON object on stdout; otherwise the text on stdout and a summary line on stderr."""
    if as_json:
        out = result.to_dict()
        if trace and result.trace is not None:
            out["trace"] = [t.__dict__ for t in result.trace]
        typer.echo(json.dumps(out))
        return
    typer.echo(result.text)
    s = result.stats
    typer.echo(
        f"[{s.generated_tokens} tokens, {s.nfe} forwards ({s.nfe_per_token:.2f}/token), "
        f"{s.verify_steps} verifications, {s.accepted}/{s.drafted} drafts accepted, {s.seconds:.2f} s]",
        err=True,
    )

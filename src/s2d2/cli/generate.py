"""``s2d2 generate``: one continuation of a prompt, as text or as JSON with ids and statistics; or, with
``--input``/``--output``, a JSONL file of requests decoded together on the batched engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import S2D2Error
from .options import (
    DecodingFlags,
    DeviceFlags,
    GenerationConfigOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    ParallelFlags,
    ProgressOpt,
    PromptChatOpt,
    RevisionOpt,
    SetOpt,
    check_max_num_seqs,
    load_model,
    option_groups,
)
from .request_file import run_request_file

PromptArg = Annotated[
    str | None,
    typer.Argument(help="Prompt text (or token ids with --ids); omit it with --input.", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object with text, ids and stats.")]
IdsOpt = Annotated[bool, typer.Option("--ids", help="PROMPT is token ids separated by spaces or commas.")]
TraceOpt = Annotated[bool, typer.Option(help="Include the per-step trace (with --json or --input).")]
InputOpt = Annotated[
    Path | None,
    typer.Option(
        "--input",
        help='JSONL requests, one a line: {"prompt": TEXT} or {"prompt_ids": [IDS]}, optionally "id", "chat" '
        "and any decoding setting by its name (a line's settings win over the flags). Needs --output.",
        show_default=False,
    ),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        help="With --input: write one JSON line per request, in input order (id, text, token_ids, stats; or "
        "id, error).",
        show_default=False,
    ),
]


JsonSchemaOpt = Annotated[
    Path | None,
    typer.Option("--json-schema", help="Structured output: the text is JSON valid under this schema file."),
]
RegexOpt = Annotated[
    str | None, typer.Option("--regex", help="Structured output: the text matches this regex.")
]


@dataclasses.dataclass(frozen=True)
class RequestFileFlags:
    """``--input`` and ``--output``: a JSONL file of requests decoded together, in place of PROMPT."""

    input_path: InputOpt = None
    output: OutputOpt = None

    def given(self, prompt: str | None, ids: bool) -> bool:
        """Whether the files are given (then ``prompt`` is not, nor ``--ids``): a one-line error for a
        combination that does not go, or for neither PROMPT nor files."""
        if self.input_path is None and self.output is None:
            if prompt is None:
                raise S2D2Error("give a PROMPT, or --input FILE --output FILE")
            return False
        if prompt is not None:
            raise S2D2Error("give either PROMPT or --input, not both")
        if self.input_path is None:
            raise S2D2Error("--output needs --input")
        if self.output is None:
            raise S2D2Error("--input needs --output")
        if ids:
            raise S2D2Error('--ids does not apply to --input (give "prompt_ids" in the file)')
        return True


@dataclasses.dataclass(frozen=True)
class StructuredFlags:
    """``--json-schema`` and ``--regex``: the form the generated text must have."""

    json_schema: JsonSchemaOpt = None
    regex: RegexOpt = None

    def keywords(self) -> dict[str, Any]:
        """``generate``'s structured-output keywords (the schema file read here)."""
        if self.json_schema is None:
            return {} if self.regex is None else {"regex": self.regex}
        try:
            text = self.json_schema.read_text()
        except OSError as exc:
            raise S2D2Error(f"cannot read --json-schema {self.json_schema}: {exc.strerror}") from None
        out: dict[str, Any] = {"json_schema": text}
        if self.regex is not None:
            out["regex"] = self.regex  # generate refuses two constraints with one line
        return out


@option_groups
def generate_command(
    prompt: PromptArg = None,
    model: ModelOpt = "tiny-gsm",
    *,
    decoding: DecodingFlags,
    chat: PromptChatOpt = False,
    as_json: JsonOpt = False,
    ids: IdsOpt = False,
    trace: TraceOpt = False,
    requests: RequestFileFlags,
    max_num_seqs: MaxNumSeqsOpt = None,
    progress: ProgressOpt = True,
    placement: DeviceFlags,
    sets: SetOpt = None,
    structured: StructuredFlags,
    revision: RevisionOpt = None,
    parallel: ParallelFlags,
    generation_config: GenerationConfigOpt = "auto",
) -> None:
    """Generate a continuation of PROMPT and print it (with --json: text, token ids and statistics).

    With --input FILE --output FILE instead of PROMPT: decode every request of a JSONL file together on
    the batched engine and write one JSON line per request; exits 1 if some requests failed (their lines
    carry "error"), 2 on a malformed input line (then no output is written).
    """
    check_max_num_seqs(max_num_seqs)
    settings = decoding.settings(sets)
    if trace:
        settings["trace"] = True
    constraint = structured.keywords()
    load_kw: dict[str, Any] = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
    if revision is not None:
        load_kw["revision"] = revision
    load_kw.update(parallel.load_options())
    # block_size: its source
    load_kw.update(generation_config=generation_config, block_size=decoding.block_size)
    if requests.given(prompt, ids):
        load_kw.update(device=placement.device, dtype=placement.dtype)
        run_request_file(
            model,
            {**settings, **constraint},
            requests.input_path,
            requests.output,
            load_kw=load_kw,
            chat=chat,
            trace=trace,
            progress=progress,
        )
        return
    m = load_model(model, placement, **load_kw)
    cfg = m.make_config(**settings)  # validate settings before any work
    prompt_in = _prompt_input(prompt, ids=ids or m.tokenizer is None, ids_flag=ids, model=model)
    result = m.generate(prompt_in, cfg, chat=chat, **constraint)
    engine = m.engine.stats()
    ranks = getattr(m.adapter, "ranks", None)
    if ranks is not None:  # each rank's share of the weights (about 1/N of them, plus the replicated)
        engine["tensor_parallel_param_bytes"] = list(ranks.param_bytes)
        if not as_json:
            typer.echo(f"[parameter bytes per rank: {', '.join(map(str, ranks.param_bytes))}]", err=True)
    _print_result(result, as_json=as_json, trace=trace, engine=engine)


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


def _print_result(result: Any, *, as_json: bool, trace: bool, engine: dict[str, Any] | None = None) -> None:
    """``--json``: one JSON object on stdout (with the engine's counters, its step planner's among them,
    under ``engine``); otherwise the text on stdout and a summary line on stderr."""
    if as_json:
        out = result.to_dict()
        if engine is not None:
            out["engine"] = engine
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

"""The ``--input`` file of ``s2d2 generate``: JSONL requests in (a prompt or prompt ids, an optional id
and chat flag, and any decoding setting by name per line), one JSON line per result out, written
atomically in input order. Every line is checked before the model loads."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from ..errors import S2D2Error
from ..files import json_object, write_text_atomically


class FileRequest:
    """One request of an ``--input`` file: where it is, its prompt, its own settings and chat flag."""

    def __init__(
        self, line: int, prompt: str | list[int], settings: dict[str, Any], chat: bool | None, rid: Any
    ):
        self.line = line
        self.prompt = prompt
        self.settings = settings
        self.chat = chat
        self.id = rid
        self.has_id = rid is not _NO_ID


_NO_ID = object()
#: Keys of an input line that are not decoding settings.
_REQUEST_KEYS = ("id", "prompt", "prompt_ids", "chat")
#: Structured-output keys of an input line (as ``generate``'s keywords) and the JSON types they take.
_CONSTRAINT_TYPES: dict[str, tuple[type, ...]] = {
    "response_format": (dict,),
    "json_schema": (dict, str),
    "regex": (str,),
    "choice": (list,),
    "grammar": (str,),
}


def _setting_types() -> dict[str, str]:
    """Decoding setting name -> its annotation (``"int"``, ``"float | None"``, ...), ``preset`` included."""
    import dataclasses

    from ..config import DecodeConfig

    types = {f.name: str(f.type) for f in dataclasses.fields(DecodeConfig)}
    types["preset"] = "str"
    return types


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_ok(value: Any, annotation: str) -> bool:
    """Whether a JSON value fits a setting's annotation (unknown annotations accept anything)."""
    parts = [p.strip() for p in annotation.split("|")]
    if value is None:
        return "None" in parts
    for part in parts:
        if part == "int" and _is_int(value):
            return True
        if part == "float" and (_is_int(value) or isinstance(value, float)):
            return True
        if part == "bool" and isinstance(value, bool):
            return True
        if part == "str" and isinstance(value, str):
            return True
        if part == "list[int]" and isinstance(value, list) and all(_is_int(x) for x in value):
            return True
        if part not in ("int", "float", "bool", "str", "list[int]", "None"):
            return True
    return False


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _type_word(annotation: str) -> str:
    parts = [p.strip() for p in annotation.split("|")]
    words = [
        _TYPE_WORDS.get(p, "a list of integers" if p == "list[int]" else p) for p in parts if p != "None"
    ]
    return " or ".join(words) + (" (or null)" if "None" in parts else "")


def _parse_line(raw: str, types: dict[str, str]) -> tuple[Any, str | list[int], dict[str, Any], bool | None]:
    """One line's (id, prompt, settings, chat); ``ValueError`` with the reason when it is malformed."""
    obj = json_object(raw, one_line=True)
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise ValueError('give exactly one of "prompt" and "prompt_ids"')
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise ValueError('"prompt" must be a string')
    else:
        prompt = obj["prompt_ids"]
        if not isinstance(prompt, list) or not all(_is_int(t) for t in prompt):
            raise ValueError('"prompt_ids" must be a list of integers')
    rid = obj.get("id", _NO_ID)
    if rid is not _NO_ID and not (isinstance(rid, str) or _is_int(rid)):
        raise ValueError('"id" must be a string or an integer')
    chat = obj.get("chat")
    if "chat" in obj and not isinstance(chat, bool):
        raise ValueError('"chat" must be true or false')
    settings: dict[str, Any] = {}
    for key, value in obj.items():
        if key in _REQUEST_KEYS:
            continue
        if key in _CONSTRAINT_TYPES:  # checked (and compiled) by generate_batch, per line
            if not isinstance(value, _CONSTRAINT_TYPES[key]):
                kinds = " or ".join(t.__name__ for t in _CONSTRAINT_TYPES[key])
                raise ValueError(f"{key!r} must be a JSON {kinds}")
            settings[key] = value
            continue
        if key not in types:
            raise ValueError(f"unknown key {key!r} (not a decoding setting)")
        if not _type_ok(value, types[key]):
            raise ValueError(f"{key!r} must be {_type_word(types[key])}, got {json.dumps(value)}")
        settings[key] = value
    return rid, prompt, settings, chat


def read_requests(path: Path) -> list[FileRequest]:
    """Every request of a JSONL file (blank lines skipped); a malformed line is a one-line error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise S2D2Error(f"cannot read {path}: {exc.strerror or exc}") from None
    types = _setting_types()
    requests = []
    for n, raw_bytes in enumerate(data.split(b"\n"), start=1):
        try:
            raw = raw_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise S2D2Error(f"{path} line {n}: not UTF-8 text") from None
        if n == 1:
            raw = raw.removeprefix("\ufeff")
        if not raw.strip():
            continue
        try:
            rid, prompt, settings, chat = _parse_line(raw, types)
        except ValueError as exc:
            raise S2D2Error(f"{path} line {n}: {exc}") from None
        requests.append(FileRequest(n, prompt, settings, chat, rid))
    if not requests:
        raise S2D2Error(f"{path} holds no requests")
    return requests


def check_paths(input_path: Path, output: Path) -> None:
    """The input must be a file and the output a writable file path other than the input."""
    if not input_path.is_file():
        raise S2D2Error(
            f"--input {input_path}: no such file"
            if not input_path.exists()
            else f"--input {input_path} is not a file"
        )
    same = input_path.resolve() == output.resolve()
    if not same and output.exists():
        with contextlib.suppress(OSError):
            same = os.path.samefile(input_path, output)
    if same:
        raise S2D2Error(f"--output {output} is the input file; choose another path")
    if output.is_dir():
        raise S2D2Error(f"--output {output} is a directory")
    parent = output.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise S2D2Error(f"cannot write --output {output}: {parent} is not a writable directory")


def run_request_file(
    model: str,
    settings: dict[str, Any],
    input_path: Path,
    output: Path,
    *,
    load_kw: dict[str, Any],
    chat: bool,
    trace: bool,
    progress: bool,
) -> None:
    """``s2d2 generate --input FILE --output FILE``: check the paths and every line, load the model, decode
    the file's requests together and write the results; exits 1 when some requests failed."""
    from ..model import load

    check_paths(input_path, output)
    requests = read_requests(input_path)  # malformed lines fail before the (slow) model load
    m = load(model, **load_kw)
    m.make_config(**settings)  # the flags must be valid on their own
    failed = generate_file(m, requests, settings, output, chat=chat, trace=trace, progress=progress)
    if failed:
        lines = ", ".join(str(requests[i].line) for i in failed[:20]) + (", ..." if len(failed) > 20 else "")
        typer.echo(f"error: {len(failed)} of {len(requests)} requests failed (lines {lines})", err=True)
        sys.exit(1)


def generate_file(
    m: Any,
    requests: list[FileRequest],
    settings: dict[str, Any],
    output: Path,
    *,
    chat: bool,
    trace: bool,
    progress: bool,
) -> list[int]:
    """Decode ``requests`` together (flags' ``settings`` under each line's own), write ``output``
    atomically; returns the indices of the requests that failed."""
    from tqdm.auto import tqdm

    from ..decoding.stats import GenerationStats
    from ..generation_result import GenerationResult

    results: list[Any] = [None] * len(requests)
    prompts: list[list[int]] = []
    live: list[int] = []
    with tqdm(
        total=len(requests), desc="generate", unit="req", file=sys.stderr, disable=None if progress else True
    ) as bar:
        for i, req in enumerate(requests):
            if isinstance(req.prompt, list):
                prompts.append(req.prompt)
                live.append(i)
                continue
            try:  # each line has its own chat flag: encode here, decode the ids together
                prompts.append(m.encode(req.prompt, chat=chat if req.chat is None else req.chat))
                live.append(i)
            except S2D2Error as exc:
                results[i] = GenerationResult("", [], GenerationStats(), error=str(exc))
                bar.update(1)

        def done(j: int, res: Any) -> None:
            results[live[j]] = res
            bar.update(1)

        if live:
            m.generate_batch(
                prompts,
                per_request=[requests[i].settings for i in live],
                errors="return",
                on_finish=done,
                **settings,
            )
    failed = [i for i, r in enumerate(results) if r.error is not None]
    records = [_output_record(req, res, trace) for req, res in zip(requests, results, strict=True)]
    write_text_atomically(output, "".join(json.dumps(rec) + "\n" for rec in records))
    if not failed:
        typer.echo(f"wrote {len(requests)} results to {output}", err=True)
    return failed


def _output_record(req: FileRequest, res: Any, trace: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": req.id} if req.has_id else {}
    out.update(res.to_dict())
    if res.error is None and res.trace is not None and (trace or req.settings.get("trace")):
        out["trace"] = [t.__dict__ for t in res.trace]
    return out

"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked, as a :class:`ToolPlan`.

OpenAI's rules: with ``tools`` given, ``tool_choice`` defaults to ``"auto"`` (the model answers in text
or calls tools); ``"required"`` makes at least one call; ``"none"`` answers in text (the tools are then
not rendered into the prompt, and the output is not parsed); a named function
(``{"type": "function", "function": {"name": N}}``) makes exactly one call of N. ``parallel_tool_calls``
(default true) lets a reply hold several calls; false stops it after the first.

Every mode but ``none`` constrains the calls with the format's structural tag
(:mod:`s2d2.constraints.tool_calls`): a call's name is one of the tools and its arguments match the
tool's ``parameters``. Bad input is a 400 naming the field (``tools.1.function.name``,
``tool_choice``, ``parallel_tool_calls``, ...). The legacy ``functions`` / ``function_call`` fields are
refused with a 400 (use ``tools`` / ``tool_choice``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...constraints import OutputConstraint
from ...constraints.tool_calls import tool_calls_source
from ..errors import bad_request
from ..served_model import ServedModel
from .formats import ToolFormat, detect_format, format_named
from .render import check_messages

#: Keys a ``tools`` entry and its ``function`` may carry (OpenAI's).
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
#: The longest function name (OpenAI's limit)
MAX_NAME = 64


@dataclass
class ToolPlan:
    """What a request asks of tools: ``mode`` (auto, required, named, none), the tools as sent (for the
    chat template), their ``(name, parameters)``, ``parallel`` and the constraint (None under none)."""

    format: ToolFormat
    mode: str
    tools: list[dict[str, Any]]
    functions: list[tuple[str, Any]]
    parallel: bool = True
    constraint: OutputConstraint | None = None
    names: set[str] = field(default_factory=set)

    @property
    def parses(self) -> bool:
        """Whether the reply is read for calls (every mode but none)."""
        return self.mode != "none"


def _function(entry: Any, i: int) -> tuple[str, Any]:
    where = f"tools.{i}"
    if (
        not isinstance(entry, dict)
        or entry.get("type") != "function"
        or not isinstance(entry.get("function"), dict)
    ):
        raise bad_request(
            f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}',
            param=where,
            code="invalid_value",
        )
    extra = sorted(set(entry) - _TOOL_KEYS) or sorted(set(entry["function"]) - _FUNCTION_KEYS)
    if extra:
        path = where if set(entry) - _TOOL_KEYS else f"{where}.function"
        raise bad_request(f"{path} has an unknown field {extra[0]!r}", param=f"{path}.{extra[0]}")
    fn = entry["function"]
    name = fn.get("name")
    plain = isinstance(name, str) and name.replace("_", "a").replace("-", "a").isalnum() and name.isascii()
    if not plain or len(name) > MAX_NAME:
        raise bad_request(
            f"{where}.function.name must be a name of 1 to {MAX_NAME} letters, digits, _ and -",
            param=f"{where}.function.name",
            code="invalid_value",
        )
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise bad_request(
            f"{where}.function.parameters must be a JSON schema of an object",
            param=f"{where}.function.parameters",
            code="invalid_value",
        )
    if "type" not in params:  # arguments are always an object
        params = {"type": "object", **params}
    return name, params


def _functions(tools: Any) -> list[tuple[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", param="tools", code="invalid_value")
    out = [_function(entry, i) for i, entry in enumerate(tools)]
    names = [n for n, _ in out]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_request(f"two tools are named {name!r}", param=f"tools.{i}.function.name")
    return out


def _mode(choice: Any, names: list[str]) -> tuple[str, str | None]:
    """``(mode, the named function or None)`` of ``tool_choice``."""
    if choice is None:
        return ("auto" if names else "none"), None
    if choice in ("auto", "required", "none"):
        if choice != "none" and not names:
            raise bad_request(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            'tool_choice must be "auto", "required", "none" or '
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
            code="invalid_value",
        )
    if name not in names:
        raise bad_request(f"tool_choice names {name!r}, which tools do not define", param="tool_choice")
    return "named", name


def refuse_legacy(body: Any) -> None:
    for name in ("functions", "function_call"):
        if getattr(body, name, None) not in (None, "none", []):
            raise bad_request(
                f"{name} is the deprecated form of tools / tool_choice: send tools and tool_choice instead",
                param=name,
                code="unsupported_parameter",
            )


def tool_plan(body: Any, fmt: ToolFormat) -> ToolPlan | None:
    """The request's :class:`ToolPlan` (None: no tools and no tool_choice); a 400 on bad input."""
    refuse_legacy(body)
    tools, choice = getattr(body, "tools", None), getattr(body, "tool_choice", None)
    parallel = getattr(body, "parallel_tool_calls", None)
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    if tools is None and choice in (None, "none"):
        return None
    functions = _functions(tools if tools is not None else [])
    mode, named = _mode(choice, [n for n, _ in functions])
    plan = ToolPlan(fmt, mode, list(tools or []), functions, parallel is not False)
    plan.names = {n for n, _ in functions}
    if mode == "none":
        return plan
    chosen = [f for f in functions if f[0] == named] if named else functions
    source = tool_calls_source(
        trigger=fmt.trigger,
        begin=fmt.begin,
        middle=fmt.middle,
        end=fmt.end,
        separator=fmt.separator,
        functions=chosen,
        mode="auto" if mode == "auto" else "required",
        parallel=plan.parallel and mode != "named",
    )
    plan.constraint = OutputConstraint("tool_calls", source)
    return plan


def model_format(model: ServedModel, parser: str | None) -> ToolFormat:
    """The call format: ``--tool-call-parser`` when given, else the one the chat template writes."""
    if parser is not None:
        return format_named(parser)
    return detect_format(getattr(model.tokenizer, "chat_template", None))


def check_spelling(model: ServedModel, fmt: ToolFormat) -> None:
    """A 400 when the model's tokenizer cannot write a call in ``fmt`` (its text does not survive
    encoding and decoding: the built-in model's WordPiece vocabulary has no braces or quotes)."""
    sample = fmt.render_call("f", '{"a": 1}')
    tok = model.tokenizer
    if tok is None or tok.decode(tok.encode(sample, add_special_tokens=False)) != sample:
        raise bad_request(
            f"this model's tokenizer cannot write tool calls (the {fmt.name} format: {sample!r})",
            param="tools",
            code="unsupported_value",
        )


def chat_tool_plan(model: ServedModel, body: Any, parser: str | None) -> ToolPlan | None:
    """:func:`tool_plan` of a chat request, after its history's calls are checked (:mod:`.render`) and,
    when the reply is read for calls, that the model can write them (:func:`check_spelling`)."""
    check_messages(body.messages)
    plan = tool_plan(body, model_format(model, parser))
    if plan is not None and plan.parses:
        check_spelling(model, plan.format)
    return plan

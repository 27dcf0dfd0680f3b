"""What a request's output must match: a JSON schema, any JSON object, a regex, a choice or an EBNF grammar.

:class:`OutputConstraint` is a plain, hashable description (no grammar library needed to make one); the
compiler (:mod:`.compiler`) turns it into a grammar once per distinct constraint. :func:`constraint_of`
reads the Python API's keywords and an OpenAI ``response_format`` into one, with one-line errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

#: The kinds of constraint, as the API names them.
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "tool_calls")


@dataclass(frozen=True)
class OutputConstraint:
    """``kind`` (one of :data:`KINDS`) and its source: the schema as canonical JSON text, the regex, the
    EBNF grammar, (``choice``) the candidate strings, or (``tool_calls``) the calls' description
    (:func:`.tool_calls.tool_calls_source`); ``json_object`` has no source."""

    kind: str
    source: str | tuple[str, ...] = ""

    def describe(self) -> str:
        return self.kind if self.kind == "json_object" else f"{self.kind} {self.source!r}"[:120]


def _schema_text(schema: Any, where: str) -> str:
    """A JSON schema given as a mapping, a JSON string or a boolean, as canonical JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(schema, (Mapping, bool)):
        raise ConfigError(f"{where} must be a JSON object (a JSON schema), got {type(schema).__name__}")
    return json.dumps(schema, separators=(",", ":"))  # key order kept: it is the properties' order


def from_response_format(response_format: Mapping[str, Any]) -> OutputConstraint | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (None), ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``."""
    if not isinstance(response_format, Mapping):
        raise ConfigError("response_format must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ConfigError("response_format json_schema needs a 'json_schema' object with a 'schema'")
        return OutputConstraint("json_schema", _schema_text(spec["schema"], "response_format's schema"))
    raise ConfigError(f"response_format type {kind!r} is not supported (text, json_object or json_schema)")


def constraint_of(
    *,
    response_format: Mapping[str, Any] | None = None,
    json_schema: Any = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
) -> OutputConstraint | None:
    """The one constraint these keywords ask for (None: free text); more than one is a ConfigError."""
    given = {
        name: value
        for name, value in (
            ("response_format", response_format),
            ("json_schema", json_schema),
            ("regex", regex),
            ("choice", choice),
            ("grammar", grammar),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ConfigError(f"give at most one output constraint, got {', '.join(given)}")
    if not given:
        return None
    if response_format is not None:
        return from_response_format(response_format)
    if json_schema is not None:
        return OutputConstraint("json_schema", _schema_text(json_schema, "json_schema"))
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ConfigError("regex must be a non-empty string")
        return OutputConstraint("regex", regex)
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ConfigError("grammar must be a non-empty EBNF string")
        return OutputConstraint("grammar", grammar)
    if isinstance(choice, str) or not all(isinstance(c, str) and c for c in choice):
        raise ConfigError("choice must be a list of non-empty strings")
    if not choice:
        raise ConfigError("choice must name at least one string")
    return OutputConstraint("choice", tuple(dict.fromkeys(choice)))

"""The request checks the Messages API's translation shares: an object with only known keys, and typed
fields, each a 400 naming the field's path (``messages.0.content.1.foo``)."""

from __future__ import annotations

from typing import Any

from ..errors import bad_request


def check_object(value: Any, known: set[str], where: str) -> dict[str, Any]:
    """``value`` as a dict whose keys are all in ``known``, else a 400 naming the path."""
    if not isinstance(value, dict):
        raise bad_request(f"{where}: must be an object", param=where, code="invalid_value")
    for key in value:
        if key not in known:
            raise bad_request(
                f"{where}.{key}: Extra inputs are not permitted",
                param=f"{where}.{key}",
                code="unknown_parameter",
            )
    return value


def required_str(obj: dict[str, Any], key: str, where: str) -> str:
    """``obj[key]``, which must be a string (a 400 naming ``where.key`` otherwise)."""
    value = obj.get(key)
    if not isinstance(value, str):
        what = "Field required" if key not in obj else "must be a string"
        raise bad_request(f"{where}.{key}: {what}", param=f"{where}.{key}", code="invalid_value")
    return value


def unsupported(where: str, what: str) -> Exception:
    """The 400 for a documented feature this server does not implement."""
    return bad_request(
        f"{where}: {what} is not supported by this server", param=where, code="unsupported_value"
    )

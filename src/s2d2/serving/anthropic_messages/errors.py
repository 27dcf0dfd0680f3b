"""Anthropic's error shape on the Messages routes: ``{"type": "error", "error": {"type", "message"}}``.

The server's handlers answer every error in OpenAI's shape (:mod:`..errors`); :class:`AnthropicErrors`,
an ASGI middleware outside all others, rewrites the JSON error answers of the routes under
:data:`PREFIX` (validation errors, a missing API key, a body over the limit, a draining server, the
endpoint's own checks) into Anthropic's shape, keeping the status. The ``error.type`` follows the status
as Anthropic's API does (:data:`ERROR_TYPES`); the message names the offending field's path (OpenAI's
``param``) when it does not already. A failure after a stream began is an ``error`` event
(:func:`error_event`).
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "/v1/messages"
#: Anthropic's ``error.type`` by HTTP status (other 4xx: invalid_request_error; other 5xx: api_error).
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for an HTTP ``status``."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(status: int, message: str) -> str:
    """A streamed ``error`` event."""
    return f"event: error\ndata: {json.dumps(error_body(status, message), ensure_ascii=False)}\n\n"


def _rewritten(status: int, body: bytes) -> bytes:
    """An OpenAI error answer's body in Anthropic's shape (any other body unchanged)."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return body
    message, param = err["message"], err.get("param")
    if isinstance(param, str) and param not in message:
        message = f"{param}: {message}"
    return json.dumps(error_body(status, message), ensure_ascii=False).encode()


def _under(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class AnthropicErrors:
    """Wraps an ASGI app: JSON error answers under :data:`PREFIX` in Anthropic's shape."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _under(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def relay(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if message["status"] >= 400 and b"json" in headers.get(b"content-type", b""):
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = _rewritten(start["status"], b"".join(chunks))
                kept = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
                kept.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": kept})
                message = {"type": "http.response.body", "body": body}
            await send(message)

        await self.app(scope, receive, relay)

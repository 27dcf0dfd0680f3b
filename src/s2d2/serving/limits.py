"""The request body size limit, as a plain ASGI middleware (413 with OpenAI's error object).

A declared ``Content-Length`` over the limit is refused before the body is read; a body without one is
counted as it arrives and refused as soon as it passes the limit.
"""

from __future__ import annotations

from typing import Any

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 1 << 20


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """Wraps an ASGI app; HTTP bodies larger than ``max_bytes`` get a 413."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_bytes} bytes", code="body_too_large")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self._error().response()(scope, receive, send)
                    return
        seen = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._error().response()(scope, receive, send)

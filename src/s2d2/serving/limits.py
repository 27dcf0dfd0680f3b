"""The request body limits, as a plain ASGI middleware: size (413) and time to arrive (408).

The middleware reads the whole body before the app sees the request (FastAPI reads it whole anyway):

* a declared ``Content-Length`` over ``max_bytes`` is refused before anything is read; a body without
  one (chunked) is counted as it arrives and refused with a 413 as soon as it passes the limit;
* the body must arrive within ``timeout`` seconds of the request head, else a 408 and the connection is
  closed (a client trickling a body cannot hold a connection and its buffer forever).

Both answers carry OpenAI's error object and ``Connection: close`` (the rest of the body is not read).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Seconds a request body may take to arrive.
DEFAULT_BODY_TIMEOUT_S = 30.0


def _closing(status: int, message: str, code: str) -> APIError:
    """The answer to a body that broke a limit: the connection is closed after it."""
    return APIError(status, message, code=code, headers={"Connection": "close"})


class BodyRefused(Exception):
    """The body broke a limit: ``error`` is the answer."""

    def __init__(self, error: APIError):
        super().__init__(error.message)
        self.error = error


class BodySizeLimit:
    """Wraps an ASGI app; HTTP bodies larger than ``max_bytes`` get a 413, slower than ``timeout`` a 408."""

    def __init__(
        self, app: Any, max_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout: float = DEFAULT_BODY_TIMEOUT_S
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    def _too_large(self) -> APIError:
        return _closing(413, f"the request body is larger than {self.max_bytes} bytes", "body_too_large")

    def _too_slow(self) -> APIError:
        message = f"the request body did not arrive within {self.timeout:g} seconds"
        return _closing(408, message, "body_timeout")

    async def _read_body(self, receive: Any) -> list[dict[str, Any]]:
        """The body's ``http.request`` messages; raises :class:`BodyRefused` past a limit."""
        deadline = time.monotonic() + self.timeout
        messages: list[dict[str, Any]] = []
        seen = 0
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except TimeoutError:
                raise BodyRefused(self._too_slow()) from None
            messages.append(message)
            if message["type"] != "http.request":
                return messages  # the client went away: the app sees the disconnect
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyRefused(self._too_large())
            if not message.get("more_body", False):
                return messages

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
                    await self._too_large().response()(scope, receive, send)
                    return
        try:
            body = await self._read_body(receive)
        except BodyRefused as refused:
            await refused.error.response()(scope, receive, send)
            return

        async def replay() -> dict[str, Any]:
            return body.pop(0) if body else await receive()

        await self.app(scope, replay, send)

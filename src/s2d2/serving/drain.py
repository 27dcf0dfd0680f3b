"""While the server drains after a stop signal: every new request is a 503 with ``Retry-After``.

The server keeps listening until its running requests have finished (or the grace ran out, see
:mod:`.server`), so a client that connects meanwhile gets an answer it can act on, not a refused
connection: a 503 in OpenAI's error format (``code`` ``draining``) with ``Retry-After`` and
``Connection: close`` (a keep-alive client reconnects, to another replica behind a load balancer).
``/health`` answers 503 itself (so a balancer stops sending), and ``/metrics`` stays readable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import APIError

#: Routes that answer while draining (their own answers say the server is going).
OPEN_WHILE_DRAINING = ("/health", "/metrics")
DRAINING_MESSAGE = "the server is shutting down; retry later or on another replica"


def draining_error(retry_after: int) -> APIError:
    """The 503 a request gets while the server drains."""
    headers = {"Retry-After": str(retry_after), "Connection": "close"}
    return APIError(503, DRAINING_MESSAGE, code="draining", headers=headers)


class DrainGate:
    """An ASGI middleware answering :func:`draining_error` to every request but
    :data:`OPEN_WHILE_DRAINING` while ``draining()`` is true."""

    def __init__(self, app: Any, *, draining: Callable[[], bool], retry_after: int):
        self.app = app
        self.draining = draining
        self.retry_after = retry_after

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") not in OPEN_WHILE_DRAINING and self.draining():
            await draining_error(self.retry_after).response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


__all__ = ["DRAINING_MESSAGE", "OPEN_WHILE_DRAINING", "DrainGate", "draining_error"]

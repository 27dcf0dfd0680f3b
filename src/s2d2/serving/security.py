"""Who may talk to the server: the Host header check and the API key, as one plain ASGI middleware.

* **Host.** Every request's ``Host`` header must name an allowed host (``s2d2 serve --allowed-hosts``;
  default: the bound address and the loopback names), else a 400: a web page on another site cannot
  reach a server on 127.0.0.1 through a DNS name it controls (DNS rebinding). ``*`` allows any host.
* **API key.** With a key (``--api-key KEY`` or ``S2D2_API_KEY``), every ``/v1`` route, the API's
  description ``/openapi.json`` and the ``/docs`` page with its assets require ``Authorization: Bearer
  KEY`` or, as Anthropic's clients send it, ``x-api-key: KEY`` (compared in constant time), else a 401
  in OpenAI's error format (Anthropic's on ``/v1/messages``); ``/health`` and ``/metrics`` stay open
  (for probes and scrapers; keep them off public networks).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from typing import Any

from .errors import APIError

#: Names a local client may use for a server bound to any address.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The routes an API key protects (every path under each).
PROTECTED_PREFIXES = ("/v1", "/openapi.json", "/docs")


def default_allowed_hosts(bound: str) -> list[str]:
    """The bound address and the loopback names (a wildcard bind adds nothing: name the hosts)."""
    hosts = list(LOOPBACK_HOSTS)
    if bound not in ("0.0.0.0", "::", "") and bound not in hosts:
        hosts.append(bound)
    return hosts


def host_name(value: str) -> str:
    """The host part of a ``Host`` header (no port; an IPv6 literal without its brackets), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _protected(path: str) -> bool:
    """Whether ``path`` is one of :data:`PROTECTED_PREFIXES` or under one."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in PROTECTED_PREFIXES)


def _normalise(host: str) -> str:
    host = host_name(host) if not host.startswith("*") else host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.rstrip(".")


class AccessControl:
    """Wraps an ASGI app with the checks of the module docstring."""

    def __init__(self, app: Any, *, allowed_hosts: Iterable[str] | None = None, api_key: str | None = None):
        self.app = app
        hosts = list(allowed_hosts) if allowed_hosts is not None else list(LOOPBACK_HOSTS)
        self.any_host = "*" in hosts
        self.hosts = {_normalise(h) for h in hosts if h != "*"}
        self.api_key = api_key.encode() if api_key else None

    def _refusal(self, scope: dict[str, Any]) -> APIError | None:
        headers = dict(scope.get("headers") or [])
        if not self.any_host:
            host = headers.get(b"host", b"").decode("latin-1")
            if _normalise(host) not in self.hosts:
                return APIError(
                    400, f"the Host header {host!r} is not allowed", param="Host", code="invalid_host"
                )
        if self.api_key is not None and _protected(scope.get("path", "")) and not self._key_ok(headers):
            return APIError(
                401,
                "a valid API key is required: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None

    def _key_ok(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the request carries the key: as a Bearer token, or in ``x-api-key``."""
        if self.api_key is None:
            return True
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        bearer = scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.api_key)
        given = headers.get(b"x-api-key")
        return bearer or (given is not None and hmac.compare_digest(given.strip(), self.api_key))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["AccessControl", "default_allowed_hosts", "host_name"]

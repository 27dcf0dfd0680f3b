"""OpenAI-style errors: one exception type for the handlers, and the app-wide exception handlers.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}``: validation errors
(FastAPI's 422) become 400s naming the first bad field, settings over an engine-wide limit 400s naming
the setting (``param`` ``s2d2.<setting>``), unknown routes 404, wrong methods 405, and an unexpected
exception a 500 saying "internal error" with an id; the log shows the exception under that id.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.request_limits import RequestLimitError

log = logging.getLogger("s2d2.serving")

#: OpenAI's error ``type`` by HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}
#: The status (no body) of a request whose client went away before its answer (nginx's "client closed
#: request").
CLIENT_CLOSED = 499


class APIError(Exception):
    """An error answer: HTTP ``status`` and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unknown_arguments(names: list[str]) -> APIError:
    """The 400 (``unknown_parameter``) naming request fields the server does not know (at least one), as
    OpenAI's API words it; ``param``: the first."""
    plural = "s" if len(names) > 1 else ""
    return bad_request(
        f"unrecognized request argument{plural} supplied: {', '.join(names)}",
        param=names[0],
        code="unknown_parameter",
    )


def decode_error(reason: str | None, cannot_end: bool, unavailable: bool = False) -> APIError:
    """The answer for a choice that failed in the engine: a 503 with ``Retry-After`` (``unavailable``:
    the model's tensor-parallel group broke; ``reason`` says so and nothing more), a 422 (``cannot_end``)
    with its reason where the request could not go on (:class:`~s2d2.errors.RequestCannotEnd`), else a
    500 (``decode_failed``)."""
    if unavailable:
        return APIError(503, reason or "unavailable", code="unavailable", headers={"Retry-After": "1"})
    if cannot_end:
        return APIError(422, f"the request could not be completed: {reason}", code="cannot_end")
    return APIError(500, f"the request failed while decoding: {reason}", code="decode_failed")


def _validation_error(exc: RequestValidationError, content_type: str = "application/json") -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request("the request body is not valid JSON", code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # union members add their type name to the location (e.g. prompt.str); keep the field path only
    loc = [p for p in loc if not (p.startswith(("list[", "str", "int")) or p in ("function-after",))]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing" and param is None:
        return bad_request("the request body is empty: send a JSON object", code="missing_body")
    if first.get("type") == "missing":
        return bad_request(f"missing required field {param!r}", param=param, code="missing_required_field")
    if first.get("type") == "model_attributes_type":
        if "json" not in content_type.lower():  # FastAPI reads a body as JSON only under a JSON type
            shown = content_type or "none"
            return bad_request(
                f"send the request body as JSON with the header Content-Type: application/json "
                f"(this request's content type: {shown})",
                code="invalid_content_type",
            )
        return bad_request("the request body must be a JSON object", param=param)
    return bad_request(f"invalid value for {param or 'body'}: {msg}", param=param, code="invalid_value")


def install_error_handlers(app: FastAPI, metrics: Any = None) -> None:
    """Make every error answer an OpenAI error object (``metrics``: counts rejected and invalid ones)."""

    def answer(err: APIError) -> JSONResponse:
        if metrics is not None and 400 <= err.status < 500:
            metrics.record_status("rejected" if err.status == 429 else "invalid")
        return err.response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(_validation_error(exc, request.headers.get("content-type", "")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.url.path}"
        return answer(APIError(exc.status_code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(RequestLimitError)
    async def _over_limit(request: Request, exc: RequestLimitError) -> JSONResponse:
        return answer(bad_request(str(exc), param=f"s2d2.{exc.setting}", code="limit_exceeded"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = f"err-{uuid.uuid4().hex[:12]}"
        log.exception("unexpected error on %s (request id %s)", request.url.path, rid)
        return APIError(500, f"internal error (request id {rid})", code="internal_error").response()

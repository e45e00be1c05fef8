"""The one place where errors become HTTP status codes and the one error body format."""

from __future__ import annotations

import logging
from contextvars import ContextVar

import orjson
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from contracts.errors import (
    AuthenticationError,
    DeadlineExceededError,
    InternalError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelExecutionError,
    ModelNotFoundError,
    NotAcceptableError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    RouteNotFoundError,
    ServiceError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from deployments.pipeline.remote_errors import as_service_error

log = logging.getLogger("textserve.errors")
# The code of the error answered in this request's task; read by the accounting middleware for metrics.
answered_error_code: ContextVar[str | None] = ContextVar("answered_error_code", default=None)
RETRY_AFTER_S = 1
# Most specific class first: lookup walks the exception's MRO.
STATUS_BY_ERROR: dict[type[ServiceError], int] = {
    UnsupportedMediaTypeError: 415,
    PayloadTooLargeError: 413,
    NotAcceptableError: 406,
    MethodNotAllowedError: 405,
    InvalidRequestError: 400,
    AuthenticationError: 401,
    PermissionDeniedError: 403,
    RateLimitedError: 429,
    ModelNotFoundError: 404,
    RouteNotFoundError: 404,
    NotReadyError: 503,
    OverloadedError: 503,
    UnavailableError: 503,
    DeadlineExceededError: 504,
    InternalError: 500,
    ModelExecutionError: 500,
    ServiceError: 500,
}


def status_of(error: ServiceError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


def error_response(error: ServiceError, headers: dict[str, str] | None = None) -> Response:
    answered_error_code.set(error.code)
    body = {"error": {"message": error.message, "type": error.type, "code": error.code}}
    if error.param:
        body["error"]["param"] = error.param
    extra = dict(headers or {}) | error.headers()
    if isinstance(error, (NotReadyError, OverloadedError, UnavailableError)):
        extra.setdefault("Retry-After", str(RETRY_AFTER_S))
    return Response(
        orjson.dumps(body), status_code=status_of(error), media_type="application/json", headers=extra
    )


async def handle_service_error(_: Request, exc: Exception) -> Response:
    return error_response(as_service_error(exc))


async def handle_http_exception(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(RouteNotFoundError("no such route"))
    if exc.status_code == 405:
        return error_response(MethodNotAllowedError("method not allowed on this route"), exc.headers)
    err = InvalidRequestError(str(exc.detail)) if exc.status_code < 500 else InternalError(str(exc.detail))
    return error_response(err)

"""The one place where errors become HTTP status codes and the one error body format."""

from __future__ import annotations

import logging
from contextvars import ContextVar

import orjson
from grpc import StatusCode
from grpc.aio import AioRpcError
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
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
from deployments.link.client import LinkBroken

log = logging.getLogger("textserve.errors")
# The code of the error answered in this request's task; read by the accounting middleware for metrics.
answered_error_code: ContextVar[str | None] = ContextVar("answered_error_code", default=None)
RETRY_AFTER_S = 1
# Transient: Serve starts a new replica (ActorDiedError subclasses RayActorError); LinkBroken: a local
# pipeline replica died with the request in it; ReplicaUnavailableError: Serve's chosen replica left before
# the call; DeploymentUnavailableError: the callee's deployment failed to deploy (Serve's own proxy: 503).
_REPLICA_GONE = (
    RayActorError,
    ActorUnavailableError,
    LinkBroken,
    ReplicaUnavailableError,
    DeploymentUnavailableError,
)
# Calls between replicas are gRPC in the high-throughput mode. Serve raises UNAVAILABLE (a replica that died,
# or whose server stopped with the call still running) as ActorUnavailableError, but passes on a CANCELLED
# sent by the callee's server once the call was accepted (Serve reads one before that as the replica shutting
# down, and retries). RESOURCE_EXHAUSTED is not here: a message over gRPC's size limit is a bug, not overload.
_GRPC_REPLICA_GONE = (StatusCode.UNAVAILABLE, StatusCode.CANCELLED)

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


def as_service_error(exc: BaseException) -> ServiceError:
    """Unwrap errors raised in another deployment (Ray wraps them) into the service's taxonomy."""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the original here
    if isinstance(cause, ServiceError):
        return cause
    if isinstance(exc, ServiceError):
        return exc
    # Where Ray raises them: the error itself (raised by this replica's handle, or pickled back over gRPC), a
    # RayTaskError subclassing it (by Ray actor call) or keeping it as `cause`, or Serve's "upstream actor
    # died" RayServeException chained to it.
    chain = [e for e in (exc, cause, exc.__cause__) if e is not None]
    # A bounded queue is full: the callee's max_queued_requests at this caller's handle, or further down.
    if any(isinstance(e, BackPressureError) for e in chain):
        return OverloadedError("the service is at capacity; retry shortly")
    if any(_replica_gone(e) for e in chain):
        return UnavailableError("a replica serving this request went away; retry shortly")
    log.exception("internal error while serving a request", exc_info=exc)
    return InternalError("internal error while serving the request; it has been logged")


def _replica_gone(exc: BaseException) -> bool:
    if isinstance(exc, AioRpcError):
        return exc.code() in _GRPC_REPLICA_GONE
    return isinstance(exc, _REPLICA_GONE)


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

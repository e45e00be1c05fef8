"""Errors raised by another replica or by Ray itself, read into the service's taxonomy
(``contracts/errors.py``).

Ray wraps what a called deployment raises, or raises its own errors for a replica that went away or a queue
that is full; every caller of another deployment (the pipeline, the router's routes) reads them here, so a
stage's failure reaches the client as the same error wherever it happened.
"""

from __future__ import annotations

import logging

from grpc import StatusCode
from grpc.aio import AioRpcError
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from contracts.errors import InternalError, OverloadedError, ServiceError, UnavailableError
from deployments.link.frames import LinkBroken

log = logging.getLogger("textserve.errors")

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

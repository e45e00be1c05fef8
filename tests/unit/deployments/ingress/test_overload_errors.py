"""Serve's back-pressure and gone replicas, as each hop raises them, become 503 + Retry-After, never 500.

The hops: router -> Model (Serve's handle, or the Unix-socket link), Model -> Tokenizer / Inference /
Serializer (Serve's handle; ``deployments/pipeline/model.py`` maps a stage's failure with the same
``as_service_error``). A handle raises Serve's error itself when its own queue for the callee is full
(``max_queued_requests``: ``router.py`` ``wrap_request_assignment``). From a hop further down it comes
back pickled over gRPC in the high-throughput mode (``replica.py`` sends the exception,
``replica_result.py`` raises it), or wrapped in a RayTaskError subclassing it by Ray actor call (Serve's
Python proxy mode, the cluster).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from ray.exceptions import ActorUnavailableError, RayTaskError
from ray.serve._private.common import DeploymentID
from ray.serve._private.serialization import RPCSerializer
from ray.serve.config import BackpressureConfig
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from contracts.errors import InternalError, OverloadedError, UnavailableError
from deployments.ingress.errors import as_service_error, error_response
from deployments.link.client import LinkBroken


def _back_pressure(config: BackpressureConfig | None = None) -> BackPressureError:
    """As Serve's router raises it at a caller whose queue for a deployment is full."""
    config = config or BackpressureConfig()
    return BackPressureError(
        num_queued_requests=256,
        max_queued_requests=256,
        status_code=config.status_code,
        retry_after_s=config.retry_after_s,
    )


def _over_grpc(exc: BaseException) -> BaseException:
    """As it arrives from a replica over gRPC: Serve pickles the exception the callee raised, as it is."""
    serializer = RPCSerializer()
    back = serializer.loads_response(serializer.dumps_response(exc))
    assert isinstance(back, BaseException)
    return back


def _by_actor_call(exc: BaseException, plain: bool = False) -> BaseException:
    """As it arrives by Ray actor call: a RayTaskError subclassing it, or (where Ray cannot subclass) one
    keeping it as ``cause``."""
    wrapped = RayTaskError("Model.run", "Traceback ...", exc)
    return wrapped if plain else wrapped.as_instanceof_cause()


def _chained(exc: BaseException) -> BaseException:
    try:
        raise RuntimeError("a call failed") from exc
    except RuntimeError as outer:
        return outer


def _grpc_error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=f"{code.name} from the replica")


def _assert_503(exc: BaseException, expected: type) -> None:
    err = as_service_error(exc)
    assert type(err) is expected, (exc, err)
    resp = error_response(err)
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    assert resp.media_type == "application/json"


BACK_PRESSURE = {
    "raised-by-this-handle": _back_pressure(),
    "429-configured": _back_pressure(BackpressureConfig(status_code=429, retry_after_s=5)),
    "over-grpc": _over_grpc(_back_pressure()),
    "by-actor-call": _by_actor_call(_back_pressure()),
    "by-actor-call-plain": _by_actor_call(_back_pressure(), plain=True),
    "chained": _chained(_back_pressure()),
}


@pytest.mark.parametrize("exc", BACK_PRESSURE.values(), ids=BACK_PRESSURE.keys())
def test_a_full_queue_anywhere_is_overloaded(exc):
    _assert_503(exc, OverloadedError)


def test_by_actor_call_the_error_is_a_subclass_named_after_both():
    """What the name check used to miss: Ray's class is ``RayTaskError(BackPressureError)``."""
    exc = BACK_PRESSURE["by-actor-call"]
    assert type(exc).__name__ == "RayTaskError(BackPressureError)"
    assert isinstance(exc, BackPressureError)


def _gone() -> dict[str, BaseException]:
    deployment = DeploymentID(name="Tokenizer", app_name="all-MiniLM-L6-v2")
    # replica_result.py: a gRPC UNAVAILABLE (replica died or unreachable) becomes this.
    unavailable = ActorUnavailableError("Actor is unavailable.", b"\x01" * 16)
    try:
        raise LinkBroken("the pipeline replica at x.sock closed the link") from asyncio.IncompleteReadError(
            b"", 4
        )
    except LinkBroken as exc:
        link = exc
    return {
        "actor-unavailable": unavailable,
        "actor-unavailable-by-actor-call": _by_actor_call(unavailable),
        "deployment-failed": DeploymentUnavailableError(deployment),
        "deployment-failed-over-grpc": _over_grpc(DeploymentUnavailableError(deployment)),
        "replica-left": ReplicaUnavailableError("Replica x is no longer available"),
        "grpc-unavailable": _grpc_error(grpc.StatusCode.UNAVAILABLE),
        "grpc-cancelled-by-the-callee": _grpc_error(grpc.StatusCode.CANCELLED),
        "link-broken": link,
    }


GONE = _gone()


@pytest.mark.parametrize("exc", GONE.values(), ids=GONE.keys())
def test_a_replica_or_deployment_that_is_gone_is_unavailable(exc):
    _assert_503(exc, UnavailableError)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL])
def test_other_grpc_failures_stay_internal_errors(code):
    assert type(as_service_error(_grpc_error(code))) is InternalError


def test_a_message_over_grpcs_size_limit_is_not_overload():
    """RESOURCE_EXHAUSTED between replicas is a message over the size limit: a bug, never a 503."""
    err = as_service_error(_grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert not isinstance(err, (OverloadedError, UnavailableError))


def test_past_the_ingress_backstop_serve_s_own_503_asks_for_the_same_retry():
    """Past the Ingress's own max_queued_requests Serve answers before the service's code runs (text/plain
    "Request dropped due to backpressure"); its Retry-After is the service's (backpressure_config)."""
    from deployments.ingress.errors import RETRY_AFTER_S
    from deployments.tools.check import decorator_options

    assert decorator_options()["Ingress"]["backpressure_config"] == {"retry_after_s": RETRY_AFTER_S}

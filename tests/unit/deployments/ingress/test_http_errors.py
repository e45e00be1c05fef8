"""Error classes -> HTTP status codes and the one error body format."""

from __future__ import annotations

import asyncio
import logging
import pickle

import orjson
import pytest
from ray.exceptions import RayTaskError
from starlette.exceptions import HTTPException

from contracts import errors as E
from deployments.ingress.errors import (
    as_service_error,
    error_response,
    handle_http_exception,
    handle_service_error,
    status_of,
)

ALL_ERRORS = [
    E.ServiceError,
    E.InvalidRequestError,
    E.InvalidJSONError,
    E.InputTooLongError,
    E.TooManyInputsError,
    E.UnsupportedMediaTypeError,
    E.NotAcceptableError,
    E.PayloadTooLargeError,
    E.ModelNotFoundError,
    E.RouteNotFoundError,
    E.MethodNotAllowedError,
    E.UnsupportedTaskError,
    E.NotReadyError,
    E.InternalError,
]


class _CustomTooLong(E.InputTooLongError):
    pass


class _CustomMedia(E.UnsupportedMediaTypeError):
    pass


class _CustomService(E.ServiceError):
    pass


@pytest.mark.parametrize(
    ("cls", "status"),
    [
        (E.UnsupportedMediaTypeError, 415),
        (_CustomMedia, 415),
        (E.PayloadTooLargeError, 413),
        (E.NotAcceptableError, 406),
        (E.MethodNotAllowedError, 405),
        (E.InvalidRequestError, 400),
        (E.InvalidJSONError, 400),
        (E.InputTooLongError, 400),
        (_CustomTooLong, 400),
        (E.TooManyInputsError, 400),
        (E.UnsupportedTaskError, 400),
        (E.ModelNotFoundError, 404),
        (E.RouteNotFoundError, 404),
        (E.NotReadyError, 503),
        (E.InternalError, 500),
        (E.ServiceError, 500),
        (_CustomService, 500),
    ],
)
def test_status_of(cls, status):
    assert status_of(cls("boom")) == status


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_error_classes_have_type_code_and_pickle(cls):
    err = cls("something went wrong", "input[3]")
    assert str(err) == "something went wrong"
    assert err.type and err.code
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.message, back.param) == ("something went wrong", "input[3]")


def test_client_errors_are_invalid_request_errors():
    for cls in ALL_ERRORS:
        if 400 <= status_of(cls("x")) < 500 and cls not in (E.ModelNotFoundError, E.RouteNotFoundError):
            assert issubclass(cls, E.InvalidRequestError), cls
            assert cls.type == "invalid_request_error"


def _body(resp) -> dict:
    return orjson.loads(resp.body)


def test_error_response_body_with_param():
    resp = error_response(E.InputTooLongError("input[2] is too long", "input[2]"))
    assert resp.status_code == 400
    assert resp.media_type == "application/json"
    assert resp.headers["content-type"].startswith("application/json")
    assert _body(resp) == {
        "error": {
            "message": "input[2] is too long",
            "type": "invalid_request_error",
            "code": "input_too_long",
            "param": "input[2]",
        }
    }
    assert "retry-after" not in resp.headers


def test_error_response_body_without_param():
    resp = error_response(E.ModelNotFoundError("no such model"))
    assert resp.status_code == 404
    assert _body(resp) == {
        "error": {"message": "no such model", "type": "not_found_error", "code": "model_not_found"}
    }


def test_error_response_not_ready_has_retry_after():
    resp = error_response(E.NotReadyError("warming up"))
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    assert _body(resp)["error"]["type"] == "service_unavailable"
    assert _body(resp)["error"]["code"] == "not_ready"


def test_error_response_keeps_given_headers():
    resp = error_response(E.NotReadyError("later"), {"Retry-After": "5", "X-Extra": "y"})
    assert resp.headers["retry-after"] == "5"
    assert resp.headers["x-extra"] == "y"
    resp = error_response(E.MethodNotAllowedError("no"), {"Allow": "POST"})
    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"


def test_as_service_error_unwraps_cause():
    inner = E.InputTooLongError("too long", "input")

    class Wrapped(Exception):
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    assert as_service_error(Wrapped(inner)) is inner


def test_as_service_error_unwraps_ray_task_error():
    inner = E.TooManyInputsError("too many", "input")
    wrapped = RayTaskError("Tokenizer.encode", "traceback...", inner)
    assert as_service_error(wrapped) is inner
    # Ray re-raises as a dynamic subclass of both RayTaskError and the cause's class
    dual = wrapped.as_instanceof_cause()
    assert isinstance(dual, E.ServiceError)
    assert as_service_error(dual) is inner


@pytest.mark.parametrize("cls", [E.InvalidRequestError, E.NotReadyError, E.InternalError])
def test_as_service_error_passes_service_errors_through(cls):
    err = cls("m")
    assert as_service_error(err) is err


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("secret detail"),
        KeyError("secret detail"),
        RuntimeError("secret detail"),
        RayTaskError("f", "tb", ValueError("secret detail")),
    ],
)
def test_as_service_error_hides_other_exceptions(exc, caplog):
    with caplog.at_level(logging.ERROR, logger="textserve.errors"):
        err = as_service_error(exc)
    assert type(err) is E.InternalError
    assert status_of(err) == 500
    assert "secret" not in err.message
    assert any(r.name == "textserve.errors" for r in caplog.records)


def test_handle_service_error():
    resp = asyncio.run(handle_service_error(None, ValueError("boom")))  # type: ignore[arg-type]
    assert resp.status_code == 500
    assert _body(resp)["error"]["code"] == "internal_error"
    resp = asyncio.run(handle_service_error(None, E.PayloadTooLargeError("big")))  # type: ignore[arg-type]
    assert resp.status_code == 413
    assert _body(resp)["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("status", "headers", "expected_status", "code"),
    [
        (404, None, 404, "not_found"),
        (405, {"Allow": "POST"}, 405, "method_not_allowed"),
        (422, None, 400, "invalid_request"),
        (400, None, 400, "invalid_request"),
        (500, None, 500, "internal_error"),
    ],
)
def test_handle_http_exception(status, headers, expected_status, code):
    exc = HTTPException(status_code=status, detail="detail text", headers=headers)
    resp = asyncio.run(handle_http_exception(None, exc))  # type: ignore[arg-type]
    assert resp.status_code == expected_status
    body = _body(resp)
    assert body["error"]["code"] == code
    if headers:
        assert resp.headers["allow"] == "POST"


def _dead_replica_errors() -> list[Exception]:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError
    from ray.serve.exceptions import RayServeException

    died = ActorDiedError()
    # What a stage call raises when the replica it waited on died: a RayTaskError subclassing the cause.
    wrapped = RayTaskError("serialize", "traceback", died).as_instanceof_cause()
    # Serve's router re-raises an upstream death as RayServeException chained to the Ray error.
    try:
        raise RayServeException("upstream actor died") from wrapped
    except RayServeException as exc:
        chained = exc
    return [died, ActorUnavailableError("unreachable", None), wrapped, chained]


@pytest.mark.parametrize("exc", _dead_replica_errors(), ids=["died", "unavailable", "wrapped", "chained"])
def test_dead_replica_is_a_retryable_503(exc):
    from contracts.errors import UnavailableError

    err = as_service_error(exc)
    assert isinstance(err, UnavailableError)
    resp = error_response(err)
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"

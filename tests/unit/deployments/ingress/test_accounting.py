"""The ingress counts every answer by route and status, and why a request was refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from contracts.errors import DeadlineExceededError, OverloadedError, PayloadTooLargeError
from deployments.ingress.accounting import CLIENT_CLOSED, RequestAccounting, route_of
from deployments.ingress.errors import error_response
from deployments.observability.metrics import rejected_reason


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str | None]] = []
        self.tenants: list[str] = []

    def answered(self, route: str, status: int, reason: str | None, tenant: str) -> None:
        self.calls.append((route, status, reason))
        self.tenants.append(tenant)


def _serve(app: Any, path: str) -> Recorder:
    recorder = Recorder()
    middleware = RequestAccounting(app, metrics=recorder)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        return None

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(middleware(scope, receive, send))
    return recorder


def _answer(make: Callable[[], Response]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await make()(scope, receive, send)  # made inside the request, as the handlers do

    return app


def test_success_and_refusals_are_counted_with_their_reason():
    assert _serve(_answer(lambda: Response(b"{}")), "/v1/embeddings").calls == [("embeddings", 200, None)]
    over = _serve(_answer(lambda: error_response(OverloadedError("busy"))), "/predict").calls
    assert over == [("predict", 503, "overloaded")]
    large = _serve(_answer(lambda: error_response(PayloadTooLargeError("big"))), "/classify/predict").calls
    assert large == [("predict", 413, "too_large")]


def test_a_client_that_left_before_the_answer_is_counted_as_closed():
    async def cancelled(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError

    assert _serve(cancelled, "/v1/embeddings").calls == [("embeddings", CLIENT_CLOSED, None)]


def test_reasons_and_routes():
    assert rejected_reason(DeadlineExceededError.code) == "deadline"
    assert rejected_reason("model_error") is None
    assert rejected_reason("invalid_json") == "invalid"
    assert route_of("/healthz") == "healthz" and route_of("/nope") == "other"

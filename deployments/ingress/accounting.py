"""ASGI middleware at the ingress: counts every answer (route, status, why it was refused).

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which costs a task and a stream per request.
It sees every response, including errors answered by the exception handlers.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.ingress.access import ANONYMOUS_ADMISSION, current_admission
from deployments.ingress.errors import answered_error_code
from deployments.observability.logs import reset_request_id, set_request_id
from deployments.observability.metrics import IngressMetrics, rejected_reason

access = logging.getLogger("textserve.access")
CLIENT_CLOSED = 499  # nginx's convention for "client closed the connection before the answer"
_ROUTES = {
    "/v1/embeddings": "embeddings",
    "/v2/embed": "cohere_embed",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/rerank": "rerank_tei",
    "/embed_sparse": "embed_sparse",
    "/tokenize": "tokenize",
    "/predict": "predict",
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/healthz": "healthz",
}


def route_of(path: str) -> str:
    for suffix, route in _ROUTES.items():
        if path.endswith(suffix):  # the app may sit under a route prefix
            return route
    return "other"


class AnswerSink(Protocol):
    def answered(self, route: str, status: int, rejected_reason: str | None, tenant: str) -> None: ...


class RequestAccounting:
    access_log = True  # set by the ingress from its config (one process per replica)

    def __init__(self, app: ASGIApp, metrics: AnswerSink | None = None) -> None:
        self._app = app
        self._metrics = metrics  # IngressMetrics, made in the replica on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        status = CLIENT_CLOSED  # no response started: the client went away first

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        request_id = _header(scope, b"x-request-id")  # Serve's proxy sets it when the client did not
        id_token = set_request_id(request_id)
        token = answered_error_code.set(None)
        tenant_token = current_admission.set(ANONYMOUS_ADMISSION)  # the access middleware sets the caller
        start = time.perf_counter()
        try:
            await self._app(scope, receive, send_and_note)
        finally:
            code = answered_error_code.get()
            answered_error_code.reset(token)
            tenant = current_admission.get().tenant
            current_admission.reset(tenant_token)
            if self._metrics is None:
                self._metrics = IngressMetrics()
            reason = rejected_reason(code) if code is not None else None
            route = route_of(scope["path"])
            self._metrics.answered(route, status, reason, tenant)
            if self.access_log:
                access.info(
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={
                        "route": route,
                        "status": status,
                        "tenant": tenant,
                        "ms": round((time.perf_counter() - start) * 1e3, 2),
                    },
                )
            reset_request_id(id_token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None

"""ASGI middleware at the ingress: every model route needs a tenant's API key; health and docs stay open.

It runs before FastAPI reads the body, so an unknown caller costs no parsing. The admitted tenant is put in
a context variable for the rest of the request: the router checks the model against it (403), the
accounting middleware counts by it, the answer charges its input tokens, and its rate-limit headers are
added to every answer. The key itself goes no further than ``AccessGate.admit``.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar

from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import ServiceError
from deployments.access.gate import ANONYMOUS, AccessGate, Admission
from deployments.access.tenants import TenantPolicy
from deployments.ingress.errors import error_response

log = logging.getLogger("textserve.ingress")

# Open to anyone: load balancers' probes and the API's own description (no data, no model time).
OPEN_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
ANONYMOUS_ADMISSION = Admission(ANONYMOUS, TenantPolicy())
current_admission: ContextVar[Admission] = ContextVar("current_admission", default=ANONYMOUS_ADMISSION)


def admission() -> Admission:
    """The tenant of the request being served (``anonymous`` without a tenants file)."""
    return current_admission.get()


class AccessControl:
    gate: AccessGate = AccessGate(None)  # set by the ingress from its config (one process per replica)

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = self.gate
        if scope["type"] != "http" or not gate.enabled or _is_open(scope):
            await self._app(scope, receive, send)
            return
        try:
            admitted = gate.admit(_authorization(scope))
        except ServiceError as exc:
            await error_response(exc)(scope, receive, send)
            return
        current_admission.set(admitted)
        if not admitted.headers:
            await self._app(scope, receive, send)
            return
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in admitted.headers.items()]

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self._app(scope, receive, send_with_limits)


def _is_open(scope: Scope) -> bool:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path in OPEN_PATHS


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return value.decode("latin-1")
    return None


async def ingress_replicas() -> int:
    """Running replicas of this ingress deployment, each of which enforces its share of a tenant's limits; 1
    when Serve cannot say."""
    try:
        context = serve.get_replica_context()
        status = await asyncio.to_thread(serve.status)
        deployment = status.applications[context.app_name].deployments[context.deployment]
        return max(1, deployment.replica_states.get("RUNNING", 1))
    except Exception as exc:
        log.debug("ingress replica count unknown: %r", exc)
        return 1

"""The Ingress's public interface to the routes beside it (``retrieval.py``, ``generation.py``): what a route
handler may use of the deployment. Each route parses its own body and builds its own job; admission,
deadlines, tracing, errors and metrics stay in the Ingress's one request path (``run_encoder``).
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the handlers.
from typing import Any, Protocol

from fastapi import Request
from ray.serve.handle import DeploymentHandle
from starlette.responses import Response

from contracts.outputs import ResponseOptions
from contracts.outputs import Route as RouteName
from contracts.tokenized import TokenizeJob
from deployments.config import LimitsConfig
from deployments.ingress.routing import ModelRouter, Route
from deployments.observability.tracing import Tracing
from deployments.user_config import IngressConfig
from preprocess.parsing import RequestT


class IngressPath(Protocol):
    """What the routes use of the ``Ingress`` deployment: its router, limits, config and tracing, the handle
    to a model's deployment, the checks every request passes, and the encoder tasks' one request path."""

    router: ModelRouter
    limits: LimitsConfig
    config: IngressConfig
    tracing: Tracing

    def handle(self, app: str, deployment: str) -> DeploymentHandle: ...

    async def parse_body(self, request: Request, schema: type[RequestT]) -> RequestT: ...

    def route_for(self, model: str | None, path: str) -> Route: ...

    def authorize(self, model: str) -> None: ...

    def charge(self, input_tokens: int) -> None: ...

    def response_options(
        self, request: Request, route: Route, name: RouteName, **extra: Any
    ) -> ResponseOptions: ...

    async def run_encoder(
        self, request: Request, route: Route, job: TokenizeJob, options: ResponseOptions
    ) -> Response: ...

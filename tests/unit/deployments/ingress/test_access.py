"""The access middleware: model routes need a key (401 in the service's error format), health and docs
stay open, the admitted tenant is visible to the handler, and every answer carries its budget."""

from __future__ import annotations

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from deployments.access.gate import AccessGate
from deployments.ingress.access import AccessControl, admission


async def whoami(request: Request) -> JSONResponse:
    return JSONResponse({"tenant": admission().tenant, "priority": admission().policy.priority})


@pytest.fixture
def client(tenants, clock, monkeypatch):
    monkeypatch.setattr(AccessControl, "gate", AccessGate(tenants.path, clock))
    routes = [
        Route(p, whoami, methods=["GET", "POST"]) for p in ("/v1/embeddings", "/healthz", "/openapi.json")
    ]
    app = Starlette(routes=routes)
    app.add_middleware(AccessControl)
    return TestClient(app)


def test_a_model_route_without_a_key_is_401_in_the_error_format(client, tenants):
    for headers in ({}, {"Authorization": "Bearer ts-not-a-key"}):
        answer = client.post("/v1/embeddings", headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == 'Bearer realm="textserve"'
        error = orjson.loads(answer.content)["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert "ts-not-a-key" not in answer.text


def test_health_and_the_api_description_stay_open(client):
    assert client.get("/healthz").json()["tenant"] == "anonymous"
    assert client.get("/openapi.json").status_code == 200


def test_the_handler_sees_the_tenant_and_the_answer_carries_its_budget(client, tenants):
    answer = client.post("/v1/embeddings", headers={"Authorization": f"Bearer {tenants.search_key}"})
    assert answer.json() == {"tenant": "search", "priority": "interactive"}
    assert answer.headers["x-ratelimit-limit-requests"] == "2"
    assert answer.headers["x-ratelimit-remaining-requests"] == "1"
    client.post("/v1/embeddings", headers={"Authorization": f"Bearer {tenants.search_key}"})
    refused = client.post("/v1/embeddings", headers={"Authorization": f"Bearer {tenants.search_key}"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert orjson.loads(refused.content)["error"]["code"] == "rate_limit_exceeded"
    bulk = client.post("/v1/embeddings", headers={"Authorization": f"Bearer {tenants.bulk_key}"})
    assert bulk.json()["priority"] == "batch"

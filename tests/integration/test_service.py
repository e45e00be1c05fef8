"""Health, model listing, OpenAPI, refusal of a bad manifest, and reconfigure without restart."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import BROKEN_APP, CLASSIFIER, DEFAULT_MODEL, app_named, deployment_named

pytestmark = pytest.mark.integration


def test_healthz_reports_ready_model(http):
    resp = http.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ready",
        "default_model": DEFAULT_MODEL,
        "models": {DEFAULT_MODEL: "ready", CLASSIFIER: "ready"},
        "versions": {DEFAULT_MODEL: ["1"], CLASSIFIER: ["1"]},
    }


def test_models_listing(http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    entry, versioned = [m for m in body["data"] if m["id"].startswith(DEFAULT_MODEL)]
    assert (entry["id"], versioned["id"]) == ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2:1")
    for e in (entry, versioned):
        assert (e["version"], e["task"], e["dimension"], e["max_tokens"], e["role"]) == (
            "1",
            "embed",
            384,
            256,
            "stable",
        )
        assert e["limits"] == {
            "max_inputs_per_request": 256,
            "max_tokens_per_input": 256,
            "max_request_bytes": 2 * 1024 * 1024,
            "max_documents_per_rerank": 256,
            "truncation": "on_request",
        }


def test_openapi_documents_request_bodies(http):
    spec = http.get("/openapi.json").json()
    for route in ("/v1/embeddings", "/predict"):
        schema = spec["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "properties" in schema and schema["additionalProperties"] is False


def test_bad_manifest_refuses_to_start(serve_harness):
    # Other tests re-apply the whole config, which rebuilds (and again refuses) the broken app.
    status = serve_harness.wait({BROKEN_APP: "DEPLOY_FAILED"}, timeout_s=60)[BROKEN_APP]
    assert "manifest field 'output.dimension'" in status.message
    assert "768" in status.message and "384" in status.message


def test_reconfigure_applies_batching_without_restart(serve_harness):
    from ray import serve

    handle = serve.get_deployment_handle("Inference", app_name=DEFAULT_MODEL)
    before = handle.batching.remote().result(timeout_s=30)

    def with_batching(max_batch_size: int, wait_s: float):
        def mutate(cfg):
            inference = deployment_named(app_named(cfg, DEFAULT_MODEL), "Inference")
            inference["user_config"] = {"max_batch_size": max_batch_size, "batch_wait_timeout_s": wait_s}

        return serve_harness.config(mutate)

    serve_harness.apply(with_batching(7, 0.002))
    try:
        deadline = time.monotonic() + 60
        after = before
        while time.monotonic() < deadline and after["max_batch_size"] != 7:
            time.sleep(0.5)
            after = handle.batching.remote().result(timeout_s=30)
        assert after["max_batch_size"] == 7 and after["batch_wait_timeout_s"] == 0.002
        assert after["pid"] == before["pid"], "user_config change must not restart the replica"
    finally:
        serve_harness.apply(serve_harness.config())
        serve_harness.wait({DEFAULT_MODEL: "RUNNING"})

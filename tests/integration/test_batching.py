"""Batching semantics on the live service: the wait window is a maximum, token budgets hold,
over-budget items still run, padding efficiency is reported."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.integration.conftest import DEFAULT_MODEL, app_named, deployment_named
from tests.integration.texts import near_limit

pytestmark = pytest.mark.integration


def _inference():
    from ray import serve

    return serve.get_deployment_handle("Inference", app_name=DEFAULT_MODEL)


@pytest.fixture
def batching(serve_harness):
    """Apply an Inference user_config for one test, restore the shipped one afterwards. Every group goes
    to Inference meanwhile (the pipeline's inline_chars 0): small ones would run on its own copy."""

    def apply(**user_config):
        def mutate(cfg):
            app = app_named(cfg, DEFAULT_MODEL)
            deployment_named(app, "Inference")["user_config"] = user_config
            deployment_named(app, "Model").setdefault("user_config", {})["inline_chars"] = 0

        serve_harness.apply(serve_harness.config(mutate))
        # Applied, and the model idle: an earlier test's abandoned request may still hold a batch on it (its
        # pass runs to the end), and these tests start from an idle model.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = _inference().batching.remote().result(timeout_s=30)
            idle = state["running"] == 0 and state["waiting"] == 0
            if idle and all(state[k] == v for k, v in user_config.items()):
                return state
            time.sleep(0.3)
        raise TimeoutError(f"user_config {user_config} never applied, or the model never went idle")

    yield apply
    serve_harness.apply(serve_harness.config())
    serve_harness.wait({DEFAULT_MODEL: "RUNNING"})


def test_wait_window_is_a_maximum_not_a_minimum(http, batching):
    batching(max_batch_size=4, batch_wait_timeout_s=0.9, adaptive_wait=False, min_wait_s=0.0, max_wait_s=1.0)
    # inline_chars 0 sends groups through the Tokenizer and Serializer replicas: their handles' first call in
    # this pipeline replica finds the replicas (test_first_request.py covers it); this test times the window.
    assert http.post("/v1/embeddings", json={"input": "first"}).status_code == 200
    # Alone on an idle model, a request does not wait out the (long) window for company...
    start = time.monotonic()
    assert http.post("/v1/embeddings", json={"input": "alone"}).status_code == 200
    alone_s = time.monotonic() - start
    # ...and a full batch leaves at once: four texts in one request fill max_batch_size=4.
    start = time.monotonic()
    assert http.post("/v1/embeddings", json={"input": ["a", "b", "c", "d"]}).status_code == 200
    full_s = time.monotonic() - start
    # The window applies only behind a running batch (unit: pipeline/test_inference_window.py).
    assert alone_s < 0.45, alone_s
    assert full_s < 0.45, full_s


def test_token_budget_and_lone_oversized_items(http, batching, reference_model):
    state = batching(max_batch_size=8, max_batch_tokens=300, batch_wait_timeout_s=0.01)
    texts = [near_limit(256), "short one", near_limit(120), "tiny"] * 3
    with ThreadPoolExecutor(6) as pool:  # concurrent single requests + one list over the budget
        singles = list(pool.map(lambda t: http.post("/v1/embeddings", json={"input": t}), texts))
        many = pool.submit(http.post, "/v1/embeddings", json={"input": texts}).result()
    assert all(r.status_code == 200 for r in singles) and many.status_code == 200
    got = np.array([d["embedding"] for d in many.json()["data"]])
    ref = reference_model.encode(texts)
    assert ((got * ref).sum(1) / np.linalg.norm(got, axis=1)).min() >= 0.999
    after = _inference().batching.remote().result(timeout_s=30)
    assert after["batches"] > state["batches"]
    assert after["batch_queue_limits"] == [8, 300]  # the batch queue sees the reconfigured budget
    assert 0.0 < after["padding_efficiency"] <= 1.0


def test_adaptive_window_shrinks_under_sparse_traffic(http, batching):
    batching(batch_wait_timeout_s=0.02, adaptive_wait=True, min_wait_s=0.001, max_wait_s=0.05)
    for i in range(15):  # one request at a time: batches of 1, far below the cap
        assert http.post("/v1/embeddings", json={"input": f"sparse {i}"}).status_code == 200
    state = _inference().batching.remote().result(timeout_s=30)
    assert state["current_wait_s"] < 0.02

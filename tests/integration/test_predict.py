"""POST /predict for the embed and classify tasks, with the model version in every response."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.models import LABELS

pytestmark = pytest.mark.integration


def test_predict_embed_single_and_list(http):
    single = http.post("/predict", json={"text": "hello world"})
    assert single.status_code == 200, single.text
    body = single.json()
    assert (body["model"], body["version"], body["task"]) == ("all-MiniLM-L6-v2", "1", "embed")
    assert np.array(body["embeddings"]).shape == (1, 384)
    many = http.post("/predict", json={"texts": ["hello world", "another text"]}).json()
    assert np.array(many["embeddings"]).shape == (2, 384)
    np.testing.assert_allclose(many["embeddings"][0], body["embeddings"][0], atol=2e-5)
    assert many["version"] == "1"


def test_predict_classify_labels_from_manifest(http):
    resp = http.post("/predict", json={"model": "tiny-sentiment", "texts": ["I love it", "I hate it", "meh"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["model"], body["version"], body["task"]) == ("tiny-sentiment", "1", "classify")
    assert resp.headers["x-model-version"] == "1"
    assert len(body["predictions"]) == 3
    for ranked in body["predictions"]:
        assert sorted(p["label"] for p in ranked) == sorted(LABELS)
        scores = [p["score"] for p in ranked]
        assert scores == sorted(scores, reverse=True)
        assert abs(sum(scores) - 1.0) < 1e-4


def test_classify_model_refuses_embeddings_route(http):
    resp = http.post("/v1/embeddings", json={"model": "tiny-sentiment", "input": "x"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_task"


def test_classify_models_listing(http):
    data = [m for m in http.get("/v1/models").json()["data"] if m["id"].startswith("tiny-sentiment")]
    entry = {
        "object": "model",
        "owned_by": "textserve",
        "version": "1",
        "role": "stable",
        "traffic_share": 1.0,
        "task": "classify",
        "routes": ["/predict", "/tokenize"],
        "max_tokens": 128,
        "labels": list(LABELS),
        "default": False,
        "limits": {  # the router's limits (the shipped defaults) and the model's own token limit
            "max_inputs_per_request": 256,
            "max_tokens_per_input": 128,
            "max_request_bytes": 2 * 1024 * 1024,
            "truncation": "on_request",
        },
    }
    # The model by name (what OpenAI clients ask for), then each served version by name:version.
    assert data == [{"id": "tiny-sentiment", **entry}, {"id": "tiny-sentiment:1", **entry}]

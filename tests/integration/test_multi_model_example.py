"""examples/multi-model.yaml as a user runs it: `serve run` on its own local Ray, three models, one endpoint
(tests/integration/examples.py: only its ports change)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import ROOT
from tests.integration.examples import serve_example

# slow: its own Ray instance, ~2.5 minutes; examples/generate.yaml is run the same way by default
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

EXAMPLE = ROOT / "examples" / "multi-model.yaml"
MODELS = ["all-MiniLM-L6-v2", "demo-sentiment-classifier", "demo-mini-embedder"]


@pytest.fixture(scope="module")
def example_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_example(EXAMPLE, MODELS, tmp_path_factory.mktemp("example")) as url:
        yield url


def test_every_model_is_listed_and_healthy(example_url: str) -> None:
    health = httpx.get(f"{example_url}/healthz", timeout=10).json()
    assert health["models"] == dict.fromkeys(MODELS, "ready")
    assert health["default_model"] == "all-MiniLM-L6-v2"
    listed = {m["id"]: m for m in httpx.get(f"{example_url}/v1/models", timeout=10).json()["data"]}
    assert set(MODELS) <= set(listed)
    assert (listed["all-MiniLM-L6-v2"]["dimension"], listed["demo-mini-embedder"]["dimension"]) == (384, 256)
    assert listed["demo-sentiment-classifier"]["labels"] == ["negative", "neutral", "positive"]
    assert [m for m in MODELS if listed[m]["default"]] == ["all-MiniLM-L6-v2"]


def test_the_openai_client_reaches_each_model_by_its_id(example_url: str) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{example_url}/v1", api_key="unused", max_retries=0)
    assert {m.id for m in client.models.list().data} >= set(MODELS)
    for model, dimension in (("all-MiniLM-L6-v2", 384), ("demo-mini-embedder", 256)):
        answer = client.embeddings.create(model=model, input=["one model", "behind one endpoint"])
        assert answer.model == model
        assert [len(d.embedding) for d in answer.data] == [dimension, dimension]
    # The classifier is reached too: it answers that it is a classify model (and /predict serves it).
    with pytest.raises(BadRequestError) as refused:
        client.embeddings.create(model="demo-sentiment-classifier", input="hello")
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "unsupported_task", body
    labels = httpx.post(
        f"{example_url}/predict",
        json={"model": "demo-sentiment-classifier", "texts": ["what a day"]},
        timeout=30,
    ).json()
    assert labels["model"] == "demo-sentiment-classifier"
    assert sorted(p["label"] for p in labels["predictions"][0]) == ["negative", "neutral", "positive"]


def test_a_request_naming_no_model_goes_to_the_default_and_an_unknown_one_is_a_404(example_url: str) -> None:
    answer = httpx.post(f"{example_url}/v1/embeddings", json={"input": "no model named"}, timeout=30).json()
    assert answer["model"] == "all-MiniLM-L6-v2" and len(answer["data"][0]["embedding"]) == 384
    missing = httpx.post(f"{example_url}/v1/embeddings", json={"input": "x", "model": "gpt-4"}, timeout=30)
    assert missing.status_code == 404
    message = missing.json()["error"]["message"]
    assert all(repr(m) in message for m in MODELS), message

"""POST /v1/embeddings over HTTP against the real default model."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import msgpack
import numpy as np
import pytest

from tests.integration.texts import VARIED, near_limit, token_count

pytestmark = pytest.mark.integration


def _vectors(resp) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_single_text_shape_usage_and_version(http):
    resp = http.post("/v1/embeddings", json={"input": "hello world", "model": "all-MiniLM-L6-v2"})
    body = resp.json()
    assert resp.status_code == 200, resp.text
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert body["data"][0]["object"] == "embedding"
    vec = np.array(body["data"][0]["embedding"])
    assert vec.shape == (384,)
    assert abs(np.linalg.norm(vec) - 1.0) < 1e-4
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # [CLS] hello world [SEP]
    assert resp.headers["x-model-version"] == "1"
    assert body["model_version"] == "1"


def test_matches_sentence_transformers(http, reference_model):
    texts = [*VARIED, near_limit(200), near_limit(256)]
    ours = _vectors(http.post("/v1/embeddings", json={"input": texts}))
    ref = reference_model.encode(texts, normalize_embeddings=False)
    cos = _cosines(ours, ref)
    assert cos.min() >= 0.999, dict(zip(texts, cos.round(5), strict=True))


def test_truncation_matches_sentence_transformers(http, reference_model):
    long_text = near_limit(400)
    assert token_count(long_text) > 256
    rejected = http.post("/v1/embeddings", json={"input": long_text})
    assert rejected.status_code == 400 and rejected.json()["error"]["code"] == "input_too_long"
    assert "256" in rejected.json()["error"]["message"]
    ours = _vectors(http.post("/v1/embeddings", json={"input": long_text, "truncate": True}))
    ref = reference_model.encode([long_text], normalize_embeddings=False)  # truncates at 256 itself
    assert _cosines(ours, ref).min() >= 0.999


def test_base64_equals_float(http):
    texts = ["first text", "second, longer text with more words"]
    floats = _vectors(http.post("/v1/embeddings", json={"input": texts}))
    resp = http.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    assert resp.status_code == 200
    decoded = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in resp.json()["data"]]
    )
    assert decoded.shape == (2, 384)
    np.testing.assert_allclose(decoded, floats, atol=1e-6)  # floats are rounded to 6 decimals


def test_dimensions_are_refused_for_a_model_not_trained_for_them(http):
    # MiniLM declares no matryoshka_dimensions (it was not trained to be cut); a model that does is tested
    # in test_retrieval_api.py. Its own size is always accepted.
    resp = http.post("/v1/embeddings", json={"input": "matryoshka", "dimensions": 64})
    assert resp.status_code == 400 and "not trained for shorter embeddings" in resp.json()["error"]["message"]
    assert http.post("/v1/embeddings", json={"input": "x", "dimensions": 384}).status_code == 200


def test_msgpack_when_accepted(http):
    resp = http.post("/v1/embeddings", json={"input": ["a b c"]}, headers={"Accept": "application/msgpack"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/msgpack")
    body = msgpack.unpackb(resp.content)
    json_body = http.post("/v1/embeddings", json={"input": ["a b c"]}).json()
    np.testing.assert_allclose(body["data"][0]["embedding"], json_body["data"][0]["embedding"], atol=1e-6)
    assert body["usage"] == json_body["usage"]


def test_list_order_and_concurrent_batches_are_consistent(http):
    texts = [f"sentence number {i} about topic {i % 5}" for i in range(24)]
    one_by_one = np.stack([_vectors(http.post("/v1/embeddings", json={"input": t}))[0] for t in texts[:6]])
    as_list = _vectors(http.post("/v1/embeddings", json={"input": texts}))
    # In bf16 a text's vector moves a little with the padding of its batch (cosine >= 0.9999 to fp32,
    # docs/benchmarks.md): the same vector to that precision, and nearer its own text than any other.
    same = one_by_one @ as_list[:6].T  # unit vectors
    assert np.diag(same).min() >= 0.999 and (same.argmax(axis=1) == np.arange(6)).all(), np.diag(same)
    # Concurrent single-text requests share groups and batches; each must get its own answer back.
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda t: http.post("/v1/embeddings", json={"input": t}), texts))
    concurrent = np.stack([_vectors(r)[0] for r in results])
    cosine = concurrent @ as_list.T  # unit vectors
    assert np.diag(cosine).min() >= 0.999, np.diag(cosine)
    assert (cosine.argmax(axis=1) == np.arange(len(texts))).all()


def test_exactly_at_limit_is_accepted(http):
    text = near_limit(256)
    assert 250 <= token_count(text) <= 256
    resp = http.post("/v1/embeddings", json={"input": text})
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] == token_count(text)

"""Rerank, Cohere embed and sparse payloads from model outputs."""

from __future__ import annotations

import pickle

import numpy as np
import orjson
import pytest

from contracts.errors import InvalidRequestError, UnsupportedTaskError
from contracts.outputs import ModelIdentity, ModelOutput, RerankOptions, ResponseOptions, SparseRows
from postprocess.render import serialize
from postprocess.retrieval import ranked, rerank_scores, sparse_payload

ID = ModelIdentity("m", "1")


def _cross(logits: list[float], activation: str = "sigmoid") -> ModelOutput:
    return ModelOutput(ID, "rerank", np.asarray(logits, np.float32)[:, None], 10, activation=activation)


def test_cross_encoder_scores_are_the_activated_logit():
    out = _cross([0.0, 2.0, -1.0])
    np.testing.assert_allclose(rerank_scores(out), 1 / (1 + np.exp(-np.array([0.0, 2.0, -1.0]))))
    np.testing.assert_allclose(rerank_scores(out, raw=True), [0.0, 2.0, -1.0])
    np.testing.assert_allclose(rerank_scores(_cross([0.5], "identity")), [0.5])


def test_embedding_scores_are_the_cosine_to_the_query_row():
    values = np.array([[1, 0], [1, 0], [0, 3], [-2, 0]], np.float32)
    out = ModelOutput(ID, "embed", values, 4)
    np.testing.assert_allclose(rerank_scores(out), [1.0, 0.0, -1.0], atol=1e-7)


def test_classifiers_cannot_rerank():
    out = ModelOutput(ID, "classify", np.ones((2, 2), np.float32), 2, labels=("a", "b"))
    with pytest.raises(UnsupportedTaskError):
        rerank_scores(out)


def test_ranking_is_stable_and_cut_to_top_n():
    assert ranked(np.array([0.1, 0.9, 0.9, 0.5]), None) == [1, 2, 3, 0]
    assert ranked(np.array([0.1, 0.9, 0.9, 0.5]), 2) == [1, 2]


def test_cohere_shape_with_documents():
    options = ResponseOptions(
        route="rerank", model_id="m", request_id="r1", rerank=RerankOptions(2, ("a", "b", "c"))
    )
    body = orjson.loads(serialize(_cross([0.0, 3.0, 1.0]), options, 6).body)
    assert body["id"] == "r1" and body["model"] == "m"
    assert [r["index"] for r in body["results"]] == [1, 2]
    assert body["results"][0]["document"] == {"text": "b"}
    assert body["results"][0]["relevance_score"] == pytest.approx(0.952574, abs=1e-6)
    assert body["usage"]["total_tokens"] == 10


def test_tei_shape_is_a_list():
    options = ResponseOptions(route="rerank_tei", rerank=RerankOptions(raw_scores=True, documents=("x", "y")))
    body = orjson.loads(serialize(_cross([1.0, 2.0]), options, 6).body)
    assert body == [{"index": 1, "score": 2.0, "text": "y"}, {"index": 0, "score": 1.0, "text": "x"}]


def test_cohere_embed_by_type():
    values = np.array([[0.5, -0.5, 0.25, 0.0, 0.1, 0.2, 0.3, -0.4, 0.9]], np.float32)
    ranges = np.vstack([np.full(9, -1.0), np.full(9, 1.0)]).astype(np.float32)
    options = ResponseOptions(
        route="cohere_embed", embedding_types=("float", "ubinary", "int8"), request_id="x"
    )
    body = orjson.loads(serialize(ModelOutput(ID, "embed", values, 3), options, 6, ranges).body)
    assert body["response_type"] == "embeddings_by_type" and body["id"] == "x"
    assert set(body["embeddings"]) == {"float", "ubinary", "int8"}
    assert body["embeddings"]["ubinary"] == [[0b10101110, 0b10000000]]
    assert body["embeddings"]["int8"][0][0] == int(np.floor(1.5 / (2 / 255))) - 128
    with pytest.raises(InvalidRequestError):
        serialize(ModelOutput(ID, "embed", values, 3), options, 6, None)


def test_openai_embeddings_with_embedding_types():
    values = np.array([[0.5, -0.5, 0.25, 0.0, 0.1, 0.2, 0.3, -0.4]], np.float32)
    options = ResponseOptions(route="embeddings", embedding_types=("binary", "float"))
    body = orjson.loads(serialize(ModelOutput(ID, "embed", values, 3), options, 6).body)
    item = body["data"][0]
    assert item["embedding"] == item["embeddings"]["binary"] == [0b10101110 - 128]
    assert item["embeddings"]["float"][0] == 0.5


def test_sparse_keeps_weights_above_the_threshold():
    values = np.array([[0.0, 1.5, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0]], np.float32)
    rows = sparse_payload(ModelOutput(ID, "sparse_embed", values, 5), 6)
    assert rows == [[{"index": 1, "value": 1.5}, {"index": 3, "value": 0.25}], []]
    with pytest.raises(UnsupportedTaskError):
        sparse_payload(ModelOutput(ID, "embed", values, 5), 6)


def test_sparse_rows_travel_as_csr_and_render_as_the_dense_rows():
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((5, 300)) > 0.97, rng.random((5, 300)), 0.0).astype(np.float32)
    dense[2] = 0.0  # a row with no weight at all
    rows = SparseRows.of(dense)
    assert rows.shape == (5, 300) and len(rows) == 5 and rows.size == np.count_nonzero(dense)
    np.testing.assert_array_equal(rows.dense(), dense)
    columns, weights = rows.row(2)
    assert columns.size == 0 and weights.size == 0
    want = sparse_payload(ModelOutput(ID, "sparse_embed", dense, 5), 6)
    assert sparse_payload(ModelOutput(ID, "sparse_embed", rows, 5), 6) == want
    assert [len(r) for r in want] == [int(np.count_nonzero(d)) for d in dense]
    # A pickled copy (what a hop between replicas carries) of SPLADE-like rows (BERT's vocabulary, a few
    # hundred non-zeros each) is a small fraction of the dense bytes.
    wide = np.zeros((4, 30522), np.float32)
    wide[:, rng.choice(30522, 300, replace=False)] = 1.0
    assert len(pickle.dumps(SparseRows.of(wide))) * 20 < len(pickle.dumps(wide))

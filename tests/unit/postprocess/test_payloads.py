"""Response payloads built from model outputs: OpenAI embeddings and /predict bodies."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from contracts.errors import InvalidRequestError, UnsupportedTaskError
from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions
from postprocess.payloads import (
    classification_rows,
    embeddings_payload,
    encode_rows,
    predict_payload,
    round_floats,
    shorten_embeddings,
)

MODEL = ModelIdentity(name="all-MiniLM-L6-v2", version="1")
LABELS = ("negative", "neutral", "positive")


def _unit_rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _embed(n: int = 3, dim: int = 16, tokens: int = 11, truncated: int = 0) -> ModelOutput:
    return ModelOutput(
        model=MODEL, task="embed", values=_unit_rows(n, dim), token_count=tokens, truncated=truncated
    )


def _classify(probs, truncated: int = 0) -> ModelOutput:
    return ModelOutput(
        model=MODEL,
        task="classify",
        values=np.asarray(probs, dtype=np.float32),
        token_count=9,
        labels=LABELS,
        truncated=truncated,
    )


def _b64_to_vec(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4")


# --- embeddings_payload ---------------------------------------------------------------------------


def test_embeddings_payload_openai_shape():
    out = _embed(n=3, dim=16, tokens=11)
    body = embeddings_payload(out, ResponseOptions(route="embeddings"), None)
    assert body["object"] == "list"
    assert body["model"] == "all-MiniLM-L6-v2"
    assert body["model_version"] == "1"
    assert body["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    for i, d in enumerate(body["data"]):
        np.testing.assert_array_equal(np.asarray(d["embedding"]), out.values[i])
        assert len(d["embedding"]) == 16


def test_embeddings_payload_base64_round_trip():
    out = _embed(n=2, dim=384)
    body = embeddings_payload(out, ResponseOptions(route="embeddings", encoding_format="base64"), 6)
    for i, d in enumerate(body["data"]):
        assert isinstance(d["embedding"], str)
        vec = _b64_to_vec(d["embedding"])
        assert vec.shape == (384,)
        # base64 carries the exact float32 bits: no rounding applied
        np.testing.assert_array_equal(vec, out.values[i])


def test_base64_is_little_endian_even_for_big_endian_input():
    values = np.array([[1.5, -2.25, 3.0]], dtype=">f4")
    (encoded,) = encode_rows(values, "base64", None)
    assert base64.b64decode(encoded) == np.array([1.5, -2.25, 3.0], dtype="<f4").tobytes()


@pytest.mark.parametrize("decimals", [0, 2, 4, 6])
def test_float_rows_rounded(decimals):
    out = _embed(n=2, dim=32)
    body = embeddings_payload(out, ResponseOptions(route="embeddings"), decimals)
    for i, d in enumerate(body["data"]):
        got = np.asarray(d["embedding"], dtype=np.float64)
        np.testing.assert_allclose(got, np.round(out.values[i].astype(np.float64), decimals), atol=1e-6)
        assert np.max(np.abs(got - out.values[i])) <= 0.5 * 10.0**-decimals + 1e-6


def test_round_floats_none_is_identity():
    v = _unit_rows(2, 4)
    assert round_floats(v, None) is v


@pytest.mark.parametrize("dims", [1, 8, 100, 383])
def test_dimensions_truncate_and_renormalize(dims):
    out = _embed(n=4, dim=384)
    body = embeddings_payload(out, ResponseOptions(route="embeddings", dimensions=dims), None)
    for i, d in enumerate(body["data"]):
        vec = np.asarray(d["embedding"], dtype=np.float64)
        assert vec.shape == (dims,)
        assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-5)
        prefix = out.values[i, :dims].astype(np.float64)
        # same direction as the prefix: cosine 1, and a positive multiple of it
        cos = vec @ prefix / (np.linalg.norm(vec) * np.linalg.norm(prefix))
        assert cos == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(vec * np.linalg.norm(prefix), prefix, atol=1e-5)


def test_dimensions_with_base64():
    out = _embed(n=1, dim=64)
    body = embeddings_payload(
        out, ResponseOptions(route="embeddings", encoding_format="base64", dimensions=10), None
    )
    vec = _b64_to_vec(body["data"][0]["embedding"])
    assert vec.shape == (10,)
    assert float(np.linalg.norm(vec)) == pytest.approx(1.0, abs=1e-6)


def test_dimensions_equal_to_model_size_keeps_values():
    out = _embed(n=2, dim=16)
    np.testing.assert_array_equal(shorten_embeddings(out.values, 16), out.values)
    np.testing.assert_array_equal(shorten_embeddings(out.values, None), out.values)


def test_shorten_zero_prefix_does_not_divide_by_zero():
    values = np.array([[0.0, 0.0, 1.0]], dtype=np.float32)
    short = shorten_embeddings(values, 2)
    assert short.dtype == np.float32
    assert np.all(np.isfinite(short))
    np.testing.assert_array_equal(short, [[0.0, 0.0]])


@pytest.mark.parametrize("dims", [0, -1, 17, 1000])
def test_invalid_dimensions_raise(dims):
    out = _embed(n=1, dim=16)
    with pytest.raises(InvalidRequestError) as info:
        embeddings_payload(out, ResponseOptions(route="embeddings", dimensions=dims), None)
    assert info.value.param == "dimensions"
    assert "16" in info.value.message


def test_embeddings_payload_rejects_classifier():
    out = _classify([[0.1, 0.2, 0.7]])
    with pytest.raises(UnsupportedTaskError) as info:
        embeddings_payload(out, ResponseOptions(route="embeddings"), 6)
    assert isinstance(info.value, InvalidRequestError)
    assert "/predict" in info.value.message
    assert "classify" in info.value.message


# --- predict_payload ------------------------------------------------------------------------------


def test_predict_payload_embed():
    out = _embed(n=2, dim=8, tokens=5)
    body = predict_payload(out, ResponseOptions(route="predict"), 4)
    assert body["model"] == "all-MiniLM-L6-v2"
    assert body["version"] == "1"
    assert body["task"] == "embed"
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert "predictions" not in body
    assert "truncated_inputs" not in body
    assert len(body["embeddings"]) == 2
    for row, expected in zip(body["embeddings"], out.values, strict=True):
        np.testing.assert_allclose(np.asarray(row, dtype=np.float64), np.round(expected, 4), atol=1e-6)


def test_predict_payload_embed_base64():
    out = _embed(n=2, dim=8)
    body = predict_payload(out, ResponseOptions(route="predict", encoding_format="base64"), 4)
    for row, expected in zip(body["embeddings"], out.values, strict=True):
        np.testing.assert_array_equal(_b64_to_vec(row), expected)


def test_payloads_name_the_model_by_the_id_the_client_used():
    """An application may serve a model under another name: answers carry the name the client sent."""
    options = ResponseOptions(route="embeddings", model_id="team-a-embedder")
    assert embeddings_payload(_embed(), options, None)["model"] == "team-a-embedder"
    options = ResponseOptions(route="predict", model_id="team-a-sentiment")
    assert predict_payload(_classify([[0.2, 0.5, 0.3]]), options, None)["model"] == "team-a-sentiment"
    assert predict_payload(_embed(), ResponseOptions(route="predict"), None)["model"] == MODEL.name


def test_predict_payload_classify():
    probs = [[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]]
    body = predict_payload(_classify(probs), ResponseOptions(route="predict"), None)
    assert body["task"] == "classify"
    assert body["version"] == "1"
    assert "embeddings" not in body
    preds = body["predictions"]
    assert len(preds) == 2
    assert [p["label"] for p in preds[0]] == ["neutral", "positive", "negative"]
    assert [p["label"] for p in preds[1]] == ["negative", "positive", "neutral"]
    for row, row_probs in zip(preds, probs, strict=True):
        scores = [p["score"] for p in row]
        assert scores == sorted(scores, reverse=True)
        assert sorted(p["label"] for p in row) == sorted(LABELS)
        assert sum(scores) == pytest.approx(1.0, abs=1e-5)
        for p in row:
            assert p["score"] == pytest.approx(row_probs[LABELS.index(p["label"])], abs=1e-6)


def test_classification_ties_keep_label_order():
    rows = classification_rows(np.array([[0.25, 0.5, 0.25]], dtype=np.float32), LABELS, None)
    assert [p["label"] for p in rows[0]] == ["neutral", "negative", "positive"]


def test_classification_scores_rounded():
    rows = classification_rows(np.array([[0.123456, 0.5, 0.376544]], dtype=np.float32), LABELS, 2)
    scores = {p["label"]: p["score"] for p in rows[0]}
    assert scores["negative"] == pytest.approx(0.12, abs=1e-6)
    assert scores["positive"] == pytest.approx(0.38, abs=1e-6)


@pytest.mark.parametrize(("truncated", "present"), [(0, False), (1, True), (3, True)])
def test_truncated_inputs_only_when_positive(truncated, present):
    for out in (_embed(truncated=truncated), _classify([[0.1, 0.2, 0.7]], truncated=truncated)):
        body = predict_payload(out, ResponseOptions(route="predict"), 6)
        assert ("truncated_inputs" in body) is present
        if present:
            assert body["truncated_inputs"] == truncated


# --- ModelOutput validation -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2), ()])
def test_model_output_requires_2d(shape):
    with pytest.raises(ValueError, match="2-D"):
        ModelOutput(model=MODEL, task="embed", values=np.zeros(shape, np.float32), token_count=1)


@pytest.mark.parametrize("labels", [(), ("a", "b"), ("a", "b", "c", "d")])
def test_model_output_label_count_must_match(labels):
    with pytest.raises(ValueError, match="one label per column"):
        ModelOutput(
            model=MODEL, task="classify", values=np.zeros((1, 3), np.float32), token_count=1, labels=labels
        )


def test_model_output_valid_classify():
    out = _classify([[0.1, 0.2, 0.7]])
    assert out.labels == LABELS
    assert out.values.shape == (1, 3)

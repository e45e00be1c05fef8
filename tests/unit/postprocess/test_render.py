"""Serialization to JSON / MessagePack and Accept-header negotiation."""

from __future__ import annotations

import base64
import re

import msgpack
import numpy as np
import orjson
import pytest

from contracts.errors import UnsupportedTaskError
from contracts.outputs import (
    JSON,
    MSGPACK,
    ModelIdentity,
    ModelOutput,
    ResponseOptions,
    SerializedResponse,
)
from postprocess.render import negotiate_media_type, render, serialize

MODEL = ModelIdentity(name="all-MiniLM-L6-v2", version="7")
LABELS = ("negative", "positive")


def _embed_output(n: int = 2, dim: int = 12) -> ModelOutput:
    v = np.random.default_rng(1).normal(size=(n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return ModelOutput(model=MODEL, task="embed", values=v, token_count=8)


def _classify_output() -> ModelOutput:
    probs = np.array([[0.123456789, 0.876543211], [0.6, 0.4]], dtype=np.float32)
    return ModelOutput(model=MODEL, task="classify", values=probs, token_count=6, labels=LABELS, truncated=1)


def _decode(resp: SerializedResponse):
    return orjson.loads(resp.body) if resp.media_type == JSON else msgpack.unpackb(resp.body)


def test_render_json_numpy_payload():
    payload = {
        "a": np.array([1.5, -2.0], dtype=np.float32),
        "b": [np.array([3.0], dtype=np.float32)],
        "c": "x",
    }
    assert orjson.loads(render(payload, JSON)) == {"a": [1.5, -2.0], "b": [[3.0]], "c": "x"}


def test_render_msgpack_numpy_payload():
    payload = {"a": np.array([1.5, -2.0], dtype=np.float32), "n": 3, "s": "é"}
    assert msgpack.unpackb(render(payload, MSGPACK)) == {"a": [1.5, -2.0], "n": 3, "s": "é"}


@pytest.mark.parametrize("media_type", [JSON, MSGPACK])
def test_serialize_embeddings(media_type):
    out = _embed_output()
    resp = serialize(out, ResponseOptions(route="embeddings", media_type=media_type), 6)
    assert isinstance(resp, SerializedResponse)
    assert resp.media_type == media_type
    assert resp.model_version == "7"
    assert isinstance(resp.body, bytes)
    body = _decode(resp)
    assert body["object"] == "list"
    assert body["model"] == "all-MiniLM-L6-v2"
    assert body["model_version"] == "7"
    assert body["usage"] == {"prompt_tokens": 8, "total_tokens": 8}
    assert [d["index"] for d in body["data"]] == [0, 1]
    for d, expected in zip(body["data"], out.values, strict=True):
        np.testing.assert_allclose(d["embedding"], expected, atol=6e-7)


def test_serialize_json_floats_have_at_most_n_decimals():
    resp = serialize(_embed_output(dim=64), ResponseOptions(route="embeddings"), 3)
    numbers = re.findall(rb"-?\d+\.(\d+)", resp.body)
    assert numbers, resp.body[:200]
    assert max(len(frac) for frac in numbers) <= 3


@pytest.mark.parametrize("media_type", [JSON, MSGPACK])
def test_serialize_embeddings_base64(media_type):
    out = _embed_output()
    resp = serialize(
        out, ResponseOptions(route="embeddings", media_type=media_type, encoding_format="base64"), 6
    )
    body = _decode(resp)
    for d, expected in zip(body["data"], out.values, strict=True):
        vec = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(vec, expected)


@pytest.mark.parametrize("media_type", [JSON, MSGPACK])
def test_serialize_predict_classify(media_type):
    resp = serialize(_classify_output(), ResponseOptions(route="predict", media_type=media_type), 4)
    assert resp.media_type == media_type
    assert resp.model_version == "7"
    body = _decode(resp)
    assert body["version"] == "7"
    assert body["task"] == "classify"
    assert body["truncated_inputs"] == 1
    assert [p["label"] for p in body["predictions"][0]] == ["positive", "negative"]
    assert [p["label"] for p in body["predictions"][1]] == ["negative", "positive"]
    assert body["predictions"][0][0]["score"] == pytest.approx(0.8765, abs=1e-6)


def test_serialize_predict_classify_json_scores_are_rounded():
    resp = serialize(_classify_output(), ResponseOptions(route="predict"), 4)
    fractions = re.findall(rb'"score":-?\d+\.(\d+)', resp.body)
    assert fractions
    assert max(len(f) for f in fractions) <= 4


@pytest.mark.parametrize("media_type", [JSON, MSGPACK])
def test_serialize_predict_embed(media_type):
    out = _embed_output()
    body = _decode(serialize(out, ResponseOptions(route="predict", media_type=media_type), 6))
    assert body["task"] == "embed"
    assert body["version"] == "7"
    assert "truncated_inputs" not in body
    np.testing.assert_allclose(body["embeddings"], out.values, atol=6e-7)


def test_serialize_embeddings_route_on_classifier_raises():
    with pytest.raises(UnsupportedTaskError):
        serialize(_classify_output(), ResponseOptions(route="embeddings"), 6)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, JSON),
        ("", JSON),
        ("*/*", JSON),
        ("application/json", JSON),
        ("text/html", JSON),
        ("application/msgpack", MSGPACK),
        ("Application/MsgPack", MSGPACK),
        ("application/json, application/msgpack", MSGPACK),
        ("application/msgpack, application/json;q=0.5", MSGPACK),
    ],
)
def test_negotiate_media_type(accept, expected):
    assert negotiate_media_type(accept) == expected


@pytest.mark.parametrize("accept", ["application/json, application/msgpack;q=0.5", "application/msgpack;q=0"])
def test_negotiate_media_type_honours_q_values(accept):
    assert negotiate_media_type(accept) == JSON

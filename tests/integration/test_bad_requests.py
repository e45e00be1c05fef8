"""Bad input gets a clear 4xx JSON error, and the next good request still succeeds."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}

# (route, raw body, headers, expected status, expected error code)
CASES = [
    ("/v1/embeddings", b"{not json", JSON, 400, "invalid_json"),
    ("/v1/embeddings", b"", JSON, 400, "invalid_json"),
    ("/v1/embeddings", b"[1, 2]", JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x"}', {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    ("/v1/embeddings", b'{"input": "x"}', {}, 415, "unsupported_media_type"),
    ("/v1/embeddings", b"{}", JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": null}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": 42}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": [1, -2, 3]}', JSON, 400, "invalid_request"),  # token ids are >= 0
    ("/v1/embeddings", b'{"input": [[1], [99999]]}', JSON, 400, "invalid_request"),  # outside the vocabulary
    ("/v1/embeddings", b'{"input": ["ok", 7]}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "embedding_types": ["int4"]}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "prompt_name": "query"}', JSON, 400, "invalid_request"),
    ("/v1/rerank", b'{"query": "q", "documents": []}', JSON, 400, "invalid_request"),
    ("/v1/rerank", b'{"query": "", "documents": ["d"]}', JSON, 400, "invalid_request"),
    ("/v1/rerank", b'{"query": "q", "documents": ["d"], "top_n": 0}', JSON, 400, "invalid_request"),
    (
        "/rerank",
        b'{"query": "q", "texts": ["d"], "truncation_direction": "Left"}',
        JSON,
        400,
        "invalid_request",
    ),
    ("/v2/embed", b'{"texts": ["x"], "truncate": "START"}', JSON, 400, "invalid_request"),
    ("/v2/embed", b'{"texts": ["x"], "output_dimension": 128}', JSON, 400, "invalid_request"),
    ("/embed_sparse", b'{"inputs": "x"}', JSON, 400, "unsupported_task"),
    (
        "/tokenize",
        b'{"input": "x", "input_type": "search_query", "prompt_name": "q"}',
        JSON,
        400,
        "invalid_request",
    ),
    ("/v1/embeddings", b'{"input": ["ok", null]}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": ""}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": []}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "encoding_format": "int8"}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": 0}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": 9999}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": "8"}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "surprise": 1}', JSON, 400, "invalid_request"),
    ("/v1/embeddings", b'{"input": "x", "model": "nope"}', JSON, 404, "model_not_found"),
    ("/v1/embeddings", b'{"input": "x", "model": "all-MiniLM-L6-v2:9"}', JSON, 404, "model_not_found"),
    ("/v1/embeddings", b'{"input": "\\ud800"}', JSON, 400, "invalid_json"),
    ("/predict", b'{"text": "a", "texts": ["b"]}', JSON, 400, "invalid_request"),
    ("/predict", b'{"texts": "not a list"}', JSON, 400, "invalid_request"),
    ("/predict", b'{"text": "a", "truncate": "yes"}', JSON, 400, "invalid_request"),
]


def _assert_error(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert err["code"] == code and err["message"]
    return err


def _assert_still_serving(http) -> None:
    ok = http.post("/v1/embeddings", json={"input": "still serving"})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384


@pytest.mark.parametrize(("route", "body", "headers", "status", "code"), CASES)
def test_bad_request_gets_4xx_and_service_keeps_serving(http, route, body, headers, status, code):
    resp = http.post(route, content=body, headers=headers)
    _assert_error(resp, status, code)
    _assert_still_serving(http)


def test_error_names_the_field(http):
    err = _assert_error(http.post("/v1/embeddings", json={"input": ["ok", 7]}), 400, "invalid_request")
    assert err["param"] == "input[1]" and "input[1]" in err["message"]
    err = _assert_error(
        http.post("/v1/embeddings", json={"input": "x", "surprise": 1}), 400, "invalid_request"
    )
    assert "surprise" in err["message"]


def test_input_over_token_limit_is_rejected_with_the_limit(http):
    err = _assert_error(http.post("/predict", json={"texts": ["fine", "word " * 300]}), 400, "input_too_long")
    assert "limit of 256 tokens per input (max_tokens_per_input" in err["message"]
    assert err["param"] == "texts[1]"  # the body's own field
    _assert_still_serving(http)


def test_too_many_inputs(http):
    err = _assert_error(http.post("/v1/embeddings", json={"input": ["x"] * 257}), 400, "too_many_inputs")
    assert "limit of 256 per request (max_inputs_per_request)" in err["message"] and err["param"] == "input"
    _assert_still_serving(http)


def test_body_over_size_limit_is_413(http):
    huge = b'{"input": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    err = _assert_error(http.post("/v1/embeddings", content=huge, headers=JSON), 413, "payload_too_large")
    assert "limit of 2097152 bytes (max_request_bytes)" in err["message"]
    _assert_still_serving(http)


def test_unknown_route_and_wrong_method(http):
    _assert_error(http.get("/v1/nothing-here"), 404, "not_found")
    _assert_error(http.get("/v1/embeddings"), 405, "method_not_allowed")
    _assert_still_serving(http)

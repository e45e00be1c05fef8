"""API fuzzing with schemathesis, from the live service's own OpenAPI schema (GET /openapi.json).

For generated requests, valid by the schema (positive) and invalid (negative): no answer is ever a 5xx, and
every error answer is JSON in the one error format. Bounded: a few dozen examples per operation and mode.

The schema is read from the running service (session fixtures), so the strategies are drawn inside the test
(``st.data()``) rather than built at import time. ``X-Request-Timeout`` is never sent: a tiny client deadline
is the one legitimate way to get a 504, and the schema does not document the header.
"""

from __future__ import annotations

import time

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

pytestmark = pytest.mark.integration

POST_EXAMPLES = 60
GET_EXAMPLES = 5
CLIENT_TIMEOUT_S = 60  # above the service's own 30 s deadline: a hang shows as a failure, not a stuck test
ERROR_KEYS = {"message", "type", "code"}
# What a schema-valid body may still legitimately get: the schema cannot express the token limit, the served
# model's name, the range of `dimensions`, the input count or predict's "exactly one of text / texts".
POSITIVE_4XX = {
    400: {"invalid_request", "input_too_long", "too_many_inputs"},
    404: {"model_not_found"},
}
# The session serves an embedding model: a sparse route is a 400 for it whatever the body.
ROUTE_4XX = {"/embed_sparse": {"unsupported_task"}}
RETRIEVAL_EXAMPLES = 25
RETRIEVAL_ROUTES = ["/v1/rerank", "/v2/rerank", "/rerank", "/v2/embed", "/tokenize", "/embed_sparse"]

OPERATIONS = [
    ("/v1/embeddings", "POST", GenerationMode.POSITIVE, POST_EXAMPLES),
    ("/v1/embeddings", "POST", GenerationMode.NEGATIVE, POST_EXAMPLES),
    ("/predict", "POST", GenerationMode.POSITIVE, POST_EXAMPLES),
    ("/predict", "POST", GenerationMode.NEGATIVE, POST_EXAMPLES),
    *[
        (route, "POST", mode, RETRIEVAL_EXAMPLES)
        for route in RETRIEVAL_ROUTES
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ],
    ("/v1/models", "GET", GenerationMode.POSITIVE, GET_EXAMPLES),
    ("/healthz", "GET", GenerationMode.POSITIVE, GET_EXAMPLES),
]


@pytest.fixture(scope="module")
def api_schema(base_url):
    raw = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw)
    documented = {(path, method.upper()) for path, ops in raw["paths"].items() for method in ops}
    assert {(path, method) for path, method, _, _ in OPERATIONS} <= documented, documented
    return schema


@pytest.fixture(scope="module")
def session():
    with requests.Session() as s:
        yield s


def _content_type(resp: schemathesis.Response) -> str:
    return ", ".join(resp.headers.get("content-type", []))  # schemathesis keeps every value of a header


def _describe(case, resp: schemathesis.Response) -> str:
    body = resp.text_lossy()[:500]
    return f"{case.method} {case.path} -> {resp.status_code}\n{case.as_curl_command()}\n{body}"


def _check_error_format(resp: schemathesis.Response, case) -> dict:
    where = _describe(case, resp)
    assert _content_type(resp).startswith("application/json"), where
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, where
    err = body["error"]
    assert ERROR_KEYS <= set(err) <= ERROR_KEYS | {"param"}, where
    assert all(isinstance(err[k], str) and err[k] for k in ERROR_KEYS), where
    assert err.get("param") is None or isinstance(err["param"], str), where
    return err


@pytest.mark.parametrize(
    ("path", "method", "mode", "examples"),
    OPERATIONS,
    ids=[f"{m} {p} {mode.value}" for p, m, mode, _ in OPERATIONS],
)
def test_generated_requests_never_get_5xx_and_errors_are_well_formed(
    api_schema, session, base_url, path, method, mode, examples
):
    strategy = api_schema[path][method].as_strategy(generation_mode=mode)
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 80  # a guard on top of max_examples; the file is expected well under it

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def run(data):
        assert time.monotonic() < deadline, "fuzzing ran past its time bound"
        case = data.draw(strategy)
        assert not any(k.lower() == "x-request-timeout" for k in (case.headers or {}))
        resp = case.call(base_url=base_url, session=session, timeout=CLIENT_TIMEOUT_S)
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        where = _describe(case, resp)
        assert resp.status_code < 500, where
        if resp.status_code >= 400:
            err = _check_error_format(resp, case)
            if mode is GenerationMode.POSITIVE:
                allowed = POSITIVE_4XX.get(resp.status_code, set()) | ROUTE_4XX.get(path, set())
                assert err["code"] in allowed, where
        else:
            assert resp.status_code == 200, where
            assert _content_type(resp).startswith("application/json"), where
            assert isinstance(resp.json(), list if path == "/rerank" else dict), where  # TEI's is a list

    run()
    print(f"\n{method} {path} [{mode.value}]: status counts {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= 1
    if mode is GenerationMode.NEGATIVE:
        # Negative data must be refused as a client error; an accepted body would mean a missing check.
        assert set(seen) <= set(range(400, 500)), seen
    # The service is still healthy after the barrage.
    assert session.get(f"{base_url}/healthz", timeout=CLIENT_TIMEOUT_S).status_code == 200

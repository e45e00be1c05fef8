"""Overload is refused early and cleanly (503 + Retry-After); deadlines give 504; nothing hangs."""

from __future__ import annotations

import itertools
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from deployments.ingress.haproxy_errors import ERROR_FILES

pytestmark = pytest.mark.integration


def _ok(http) -> None:
    resp = http.post("/v1/embeddings", json={"input": "still serving"})
    assert resp.status_code == 200, resp.text


def test_client_deadline_gives_504_and_the_service_keeps_serving(http):
    resp = http.post("/v1/embeddings", json={"input": ["y"] * 64}, headers={"X-Request-Timeout": "0.001"})
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    _ok(http)


@pytest.mark.parametrize("value", ["soon", "-1", "0", "inf"])
def test_bad_timeout_header_is_400(http, value):
    resp = http.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": value})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "x-request-timeout"


def test_over_capacity_gets_503_with_retry_after_and_nothing_is_lost(http, ingress_config):
    ingress_config(max_in_flight=2)
    texts = [f"overload text number {i} with a few more words" for i in range(32)]
    with ThreadPoolExecutor(16) as pool:
        started = time.monotonic()
        responses = list(pool.map(lambda _: http.post("/v1/embeddings", json={"input": texts}), range(48)))
        elapsed = time.monotonic() - started
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503}, codes  # every request answered: served or refused, nothing else
    refused = [r for r in responses if r.status_code == 503]
    assert refused and codes.count(200) >= 2
    for r in refused:
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
    assert elapsed < 60
    _ok(http)


def test_degraded_answer_from_recent_results_when_the_model_path_is_late(http):
    # serve_config.yaml turns the fallback cache on (fallback_cache_mb); a late request that was
    # answered before gets that answer, marked degraded, instead of a 504.
    body = {"input": ["a text answered once", "and a second one"]}
    fresh = http.post("/v1/embeddings", json=body)
    assert fresh.status_code == 200 and "degraded" not in fresh.json()
    late = http.post("/v1/embeddings", json=body, headers={"X-Request-Timeout": "0.001"})
    assert late.status_code == 200, late.text
    assert late.headers["x-degraded"] == "true"
    assert late.json()["degraded"] is True
    assert late.json()["data"] == fresh.json()["data"]
    never_seen = http.post(
        "/v1/embeddings", json={"input": "never seen"}, headers={"X-Request-Timeout": "0.001"}
    )
    assert never_seen.status_code == 504


def _haproxy_file(harness, variable: str) -> Path:
    """The session HAProxy's file that a RAY_SERVE_HAPROXY_* path variable names: Ray puts it in a directory
    of the node's id beside the name."""
    import ray
    from ray.serve._private import constants

    env = harness.base_config["controller_options"]["runtime_env"]["env_vars"]
    directory, name = os.path.split(env.get(variable, getattr(constants, variable)))
    return Path(directory) / ray.get_runtime_context().get_node_id() / name


def _admin(socket_path: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(socket_path))
        s.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: s.recv(65536), b"")).decode()


def test_with_no_ingress_replica_haproxy_answers_the_service_503(serve_harness, http):
    """HAProxy's own answer when no server of the router's backend can take a request (the ingress replica and
    Ray's fallback proxy both down: here put in maintenance through HAProxy's admin socket, for a moment):
    the service's JSON 503 + Retry-After, not Ray's text/plain 500 (deployments/ingress/haproxy/haproxy)."""
    backend = "http-textserve"  # the router's application, at "/"
    admin = _haproxy_file(serve_harness, "RAY_SERVE_HAPROXY_SOCKET_PATH")
    # An HAProxy reload between the maintenance command and the request (Serve reloads it when a test app is
    # deployed or removed) hands the request to a new process whose servers are ready: try again, at most 3
    # times. Any answer other than 200 or 503 fails at once below.
    for _ in range(3):
        config = _haproxy_file(serve_harness, "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC").read_text()
        section = itertools.takewhile(
            lambda line: line.startswith(" "), config.split(f"backend {backend}\n", 1)[1].splitlines()
        )
        servers = [line.split()[1] for line in section if line.split()[:1] == ["server"]]
        assert servers, config
        try:
            for server in servers:
                _admin(admin, f"set server {backend}/{server} state maint")
            # A new connection: one the session's client kept alive may belong to an HAProxy process that an
            # earlier reload replaced, which this admin socket does not reach.
            resp = httpx.post(
                f"{serve_harness.url}/v1/embeddings", json={"input": "nobody to take it"}, timeout=30
            )
        finally:
            for server in servers:
                _admin(admin, f"set server {backend}/{server} state ready")
        if resp.status_code != 200:
            break
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["error"] == {  # HAProxy's file, not an answer of the ingress
        "message": ERROR_FILES["503.http"].message,
        "type": "service_unavailable",
        "code": "unavailable",
    }
    deadline = time.monotonic() + 30  # the servers pass their health checks again
    while http.post("/v1/embeddings", json={"input": "back"}).status_code != 200:
        assert time.monotonic() < deadline, "the router's servers did not come back"
        time.sleep(0.25)

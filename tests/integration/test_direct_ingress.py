"""The faster HTTP path: Ray Serve's direct ingress behind HAProxy (README "Faster HTTP path").

Both are experimental Ray Serve features switched on by environment variables of the Ray processes,
so they cannot share the session's Ray instance: this test starts ``serve_config.yaml`` on a private
Ray instance with them (the benchmark's own launcher, private HAProxy ports and sockets), checks that
HAProxy is really in front, and that the API behaves as it does on the default path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench import procs
from bench.service import DIRECT_INGRESS_ENV, ROOT, RayServeService, ServiceVariant

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


def _haproxy_in(session_id: int) -> list[int]:
    return [p for p in procs.find_leftovers(session_id) if "/haproxy " in procs.cmdline(p) + " "]


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayServeService]:
    variant = ServiceVariant(name="direct", config=ROOT / "serve_config.yaml", env=DIRECT_INGRESS_ENV)
    service = RayServeService(variant, Path(tmp_path_factory.mktemp("direct-ingress")), num_cpus=2)
    try:
        service.start()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def client(direct: RayServeService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=direct.base_url, timeout=60.0) as c:
        yield c


def test_haproxy_is_in_front(direct: RayServeService) -> None:
    assert direct.session_id is not None
    assert _haproxy_in(direct.session_id), "no HAProxy process in the service's session"


def test_same_answers_as_the_default_path(client: httpx.Client, http: httpx.Client) -> None:
    texts = ["hello world", "A much longer sentence about serving embeddings over HTTP, fast."]
    body = {"input": texts, "model": MODEL}
    fast = client.post("/v1/embeddings", json=body, headers={"X-Request-Id": "direct-1"})
    default = http.post("/v1/embeddings", json=body)
    assert fast.status_code == 200, fast.text
    assert fast.headers["x-request-id"] == "direct-1"
    assert fast.headers["x-model-version"] == "1"
    a = np.array([d["embedding"] for d in fast.json()["data"]])
    b = np.array([d["embedding"] for d in default.json()["data"]])
    assert a.shape == (2, 384)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert fast.json()["usage"] == default.json()["usage"]


def test_errors_keep_the_service_format(client: httpx.Client) -> None:
    empty = client.post("/v1/embeddings", json={"input": [], "model": MODEL})
    assert empty.status_code == 400
    assert empty.json()["error"]["param"] == "input"
    assert empty.headers.get("x-request-id")  # generated when the client sends none
    wrong = client.post("/v1/embeddings", json={"input": "x", "model": "no-such-model"})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    garbage = client.post(
        "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert garbage.status_code == 400 and garbage.json()["error"]["type"] == "invalid_request_error"


def test_concurrent_requests_each_get_their_own_answer(client: httpx.Client) -> None:
    texts = [f"request number {i} about {'many ' * (i % 7)}things" for i in range(48)]

    def one(text: str) -> tuple[int, list[float]]:
        r = client.post("/v1/embeddings", json={"input": text, "model": MODEL})
        return r.status_code, r.json()["data"][0]["embedding"] if r.status_code == 200 else []

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, texts))
    assert [code for code, _ in results] == [200] * len(texts)
    alone = client.post("/v1/embeddings", json={"input": texts[5], "model": MODEL}).json()
    np.testing.assert_allclose(results[5][1], alone["data"][0]["embedding"], atol=1e-5)
    assert len({tuple(v) for _, v in results}) == len(texts)  # nobody got somebody else's vector


def test_replica_logs_stay_one_json_object_per_line(direct: RayServeService) -> None:
    # The high-throughput mode would send replica stderr into Serve's own log files, wrapped in its
    # text format; RAY_SERVE_LOG_TO_STDERR=1 in the mode's env keeps our JSON lines as they are.
    logs = direct.ray_logs_dir
    assert logs is not None and logs.is_dir()
    records = [
        json.loads(line)
        for path in logs.glob("worker-*.err")
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]
    ready = [r for r in records if r.get("logger") == "textserve.inference" and "ready:" in r.get("msg", "")]
    assert ready, "the inference replica's JSON 'ready' line is not in the workers' stderr logs"
    assert ready[0]["deployment"] == "Inference"
    for path in (logs / "serve").glob("replica_*.log"):
        assert '"logger":"textserve' not in path.read_text(errors="replace"), path.name

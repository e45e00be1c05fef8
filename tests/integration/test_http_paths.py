"""The two HTTP paths: Ray Serve's high-throughput mode, which ``serve_config.yaml`` switches on
(HAProxy in front of the ingress replica, which takes HTTP itself, and gRPC between replicas), and
Serve's Python proxy, the way back (README "HTTP path").

The session's instance runs the shipped config, so every other integration test runs through HAProxy;
here it is checked that HAProxy really is in front of it. The Python proxy needs other environment
variables in the Ray processes, so it runs on a private Ray instance (the benchmark's own launcher,
which deploys as `serve run` does) and must answer exactly as the shipped path does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from bench import procs
from bench.service import PROXY_ENV, ROOT, RayServeService, ServiceVariant

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


def _haproxies() -> list[int]:
    return [p.pid for p in psutil.process_iter() if "/haproxy " in procs.cmdline(p.pid) + " "]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayServeService]:
    variant = ServiceVariant(name="proxy", config=ROOT / "serve_config.yaml", env=PROXY_ENV)
    service = RayServeService(variant, Path(tmp_path_factory.mktemp("python-proxy")), num_cpus=2)
    try:
        service.start()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def client(proxy: RayServeService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.base_url, timeout=60.0) as c:
        yield c


def test_haproxy_is_in_front_of_the_shipped_config(base_url: str) -> None:
    import ray

    # HAProxy's config for this node lives under a directory named after the node id; it must bind the
    # session's HTTP port (the harness gives serve_config.yaml a free one).
    node_id = ray.get_runtime_context().get_node_id()
    ours = [p for p in _haproxies() if node_id in procs.cmdline(p)]
    assert ours, "no HAProxy process for the session's Ray node"
    cfg_path = next(a for a in procs.cmdline(ours[0]).split() if a.endswith("haproxy.cfg"))
    port = base_url.rsplit(":", 1)[1]
    assert f"127.0.0.1:{port}" in Path(cfg_path).read_text()


@pytest.mark.slow  # a private Ray instance for Serve's Python proxy: ~1 min
def test_the_python_proxy_runs_without_haproxy(proxy: RayServeService) -> None:
    assert proxy.session_id is not None
    mine = [p for p in procs.find_leftovers(proxy.session_id) if "/haproxy " in procs.cmdline(p) + " "]
    assert mine == [], "the Python-proxy variant started an HAProxy"


@pytest.mark.slow  # a private Ray instance for Serve's Python proxy: ~1 min
def test_same_answers_on_both_paths(client: httpx.Client, http: httpx.Client) -> None:
    texts = ["hello world", "A much longer sentence about serving embeddings over HTTP, fast."]
    body = {"input": texts, "model": MODEL}
    via_proxy = client.post("/v1/embeddings", json=body, headers={"X-Request-Id": "proxy-1"})
    shipped = http.post("/v1/embeddings", json=body, headers={"X-Request-Id": "shipped-1"})
    for r, rid in ((via_proxy, "proxy-1"), (shipped, "shipped-1")):
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == rid
        assert r.headers["x-model-version"] == "1"
    a = np.array([d["embedding"] for d in via_proxy.json()["data"]])
    b = np.array([d["embedding"] for d in shipped.json()["data"]])
    assert a.shape == (2, 384)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert via_proxy.json()["usage"] == shipped.json()["usage"]


@pytest.mark.slow  # a private Ray instance for Serve's Python proxy: ~1 min
@pytest.mark.parametrize("path", ["proxy", "shipped"])
def test_errors_keep_the_service_format(path: str, client: httpx.Client, http: httpx.Client) -> None:
    c = client if path == "proxy" else http
    empty = c.post("/v1/embeddings", json={"input": [], "model": MODEL})
    assert empty.status_code == 400
    assert empty.json()["error"]["param"] == "input"
    assert empty.headers.get("x-request-id")  # generated when the client sends none
    wrong = c.post("/v1/embeddings", json={"input": "x", "model": "no-such-model"})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    garbage = c.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"})
    assert garbage.status_code == 400 and garbage.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow  # a private Ray instance for Serve's Python proxy: ~1 min
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


def test_replica_logs_stay_one_json_object_per_line() -> None:
    # The high-throughput mode would send replica stderr into Serve's own log files, wrapped in its
    # text format; RAY_SERVE_LOG_TO_STDERR=1 in serve_config.yaml keeps our JSON lines as they are.
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    records = [
        json.loads(line)
        for path in logs.glob("worker-*.err")
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]
    ready = [r for r in records if r.get("logger") == "textserve.inference" and "ready:" in r.get("msg", "")]
    assert ready, "the inference replica's JSON 'ready' line is not in the workers' stderr logs"
    assert {r["deployment"] for r in ready} >= {"Inference"}
    for path in (logs / "serve").glob("replica_*.log"):
        assert '"logger":"textserve' not in path.read_text(errors="replace"), path.name

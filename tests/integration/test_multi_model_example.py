"""examples/multi-model.yaml as a user runs it: `serve run` on its own local Ray, three models, one endpoint.

The only change to the file is its ports (private ones, so a `serve run` on this machine is never disturbed);
everything else, the demo models built by `.ci/setup` included, is what a fresh clone runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from bench.procs import free_port
from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

EXAMPLE = ROOT / "examples" / "multi-model.yaml"
SERVE_CLI = Path(sys.executable).parent / "serve"
START_TIMEOUT_S = 240
MODELS = ["all-MiniLM-L6-v2", "demo-sentiment-classifier", "demo-mini-embedder"]
# The high-throughput mode gives each replica its own HTTP and gRPC port from fixed ranges (30000-31000,
# 40000-41000), chosen per Ray instance: a second instance beside the test session's would take the same
# ports, and HAProxy could send its requests to the other instance's replicas. Other ranges here.
OWN_REPLICA_PORTS = {
    "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "31001",
    "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "32000",
    "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": "41001",
    "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "42000",
}


def _with_private_ports(path: Path, port: int) -> str:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["http_options"]["port"] = port
    env = config["controller_options"]["runtime_env"]["env_vars"]
    env.update(RAY_SERVE_HAPROXY_STATS_PORT=str(free_port()), RAY_SERVE_HAPROXY_METRICS_PORT=str(free_port()))
    # Ray's processes take these from the config, not from serve run's environment. HAProxy falls back to
    # Serve's proxy (8500) while the ingress starts: that one must be this instance's too.
    env.update(OWN_REPLICA_PORTS)
    env.update(
        RAY_SERVE_FALLBACK_PROXY_HTTP_PORT=str(free_port()),
        RAY_SERVE_FALLBACK_PROXY_GRPC_PORT=str(free_port()),
    )
    for app in config["applications"]:
        app["runtime_env"] = {"env_vars": {**app["runtime_env"]["env_vars"], **env}}
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def example_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("example")
    port = free_port()
    config = _with_private_ports(tmp / "multi-model.yaml", port)
    # RAY_ADDRESS=local: a new Ray instance of its own, as on a machine where no other Ray runs.
    # Nothing of the test session's own Ray (ray.init sets RAY_* variables in this process) reaches it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_ADDRESS"] = "local"
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(SERVE_CLI), "run", config], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (
                f"serve run exited {proc.returncode}: {(tmp / 'serve.log').read_text()}"
            )
            try:
                health = httpx.get(f"{url}/healthz", timeout=5)
                body = health.json() if health.status_code == 200 else {}
                if set(body.get("models", ())) == set(MODELS) and body["status"] == "ready":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"not ready in {START_TIMEOUT_S} s: {(tmp / 'serve.log').read_text()}"
            )
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: serve run deletes its apps and stops its Ray
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


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

"""Two Ray nodes on one machine (the engine a cluster uses): replicas on both, traffic served by both.

A second node joins the session's Ray with `ray start --address=...`, as a worker pod joins the head
on KubeRay; the inference and pipeline deployments ask for one replica per node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from ray._common.utils import get_ray_address_file

from tests.integration.conftest import ServeHarness, deployment_named, routed_model

# Slow (about 2-3 minutes with its set-up and teardown): in `bash .ci/run -m slow`, not the default suite.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "multinode"
ROUTE = "/multinode"
RAY_CLI = Path(sys.executable).parent / "ray"


def _alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


@pytest.fixture
def second_node() -> Iterator[str]:
    # `ray start` records the cluster it joined here, and a later plain `ray.init()` or `serve run` would
    # try to join it after this session's Ray is gone: put the file back as it was.
    address_file = Path(get_ray_address_file(None))
    saved = address_file.read_text() if address_file.exists() else None
    before = set(_alive_nodes())
    cmd = [str(RAY_CLI), "start", "--address", ray.get_runtime_context().gcs_address, "--num-cpus", "2"]
    proc = subprocess.Popen(
        [*cmd, "--block"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not (added := set(_alive_nodes()) - before):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"second node never joined: {proc.stderr.read().decode() if proc.stderr else ''}"
                )
            time.sleep(0.5)
        yield added.pop()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if saved is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(saved)


@pytest.fixture
def multinode_app(serve_harness: ServeHarness, model_repo: Path, second_node: str) -> Iterator[str]:
    model = {"repository": str(model_repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"}
    entry, router = routed_model(serve_harness, APP, ROUTE, model)
    inference = deployment_named(entry, "Inference")
    inference.pop("autoscaling_config", None)
    inference.update(num_replicas=2, max_replicas_per_node=1)  # one replica on each node
    # The pipeline on both nodes too: the router (on the head) then has a replica its link does not reach,
    # and sends by Serve's handle (deployments/link/client.py).
    deployment_named(entry, "Model").update(num_replicas=2, max_replicas_per_node=1)
    serve_harness.deploy_extra(entry, router)
    yield f"{serve_harness.url}{ROUTE}/predict"
    serve_harness.remove_extras()


def test_replicas_on_both_nodes_serve_traffic(multinode_app: str, second_node: str) -> None:
    head = ray.get_runtime_context().get_node_id()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(
                lambda i: httpx.post(multinode_app, json={"text": f"request {i}"}, timeout=30).status_code,
                range(200),
            )
        )
    assert statuses == [200] * 200

    handle = serve.get_deployment_handle("Inference", app_name=APP)
    per_node: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 30
    while len(per_node) < 2 and time.monotonic() < deadline:  # calls land on either replica
        stats = handle.batching.remote().result(timeout_s=30)
        per_node[stats["node_id"]] = stats
    print(
        "\nmulti-node: "
        + ", ".join(
            f"{'head' if node == head else 'second'} node: {s['sequences']} sequences, {s['batches']} batches"
            for node, s in per_node.items()
        )
    )
    assert set(per_node) == {head, second_node}
    assert all(s["sequences"] > 0 for s in per_node.values())

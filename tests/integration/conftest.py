"""One local Ray instance and one Serve deployment of the real config per test session.

The apps are deployed from ``serve_config.yaml`` through the same controller call that
``serve run serve_config.yaml`` makes (its high-throughput mode included: HAProxy in front of the
ingress replicas), plus a test classifier app and a deliberately broken app.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.procs import free_port
from tests.support.models import build_classifier, write_broken_embedder

ROOT = Path(__file__).resolve().parents[2]
APP = "textserve"
CLASSIFY_APP = "classify"
BROKEN_APP = "broken"
DEPLOY_TIMEOUT_S = 240


class ServeHarness:
    """Applies whole multi-app configs (Serve's declarative API) and waits for them."""

    def __init__(self, base_config: dict[str, Any], port: int, dashboard_url: str) -> None:
        self.base_config = base_config
        self.url = f"http://127.0.0.1:{port}"
        self.dashboard_url = dashboard_url

    def config(self, mutate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        cfg = copy.deepcopy(self.base_config)
        if mutate:
            mutate(cfg)
        return cfg

    def apply(self, config: dict[str, Any]) -> None:
        from ray.serve._private.api import serve_start
        from ray.serve.schema import ServeDeploySchema

        schema = ServeDeploySchema.model_validate(config)
        # controller_options as `serve run` passes them: the config's high-throughput mode (HAProxy in front).
        client = serve_start(
            http_options=schema.http_options.model_dump(),
            proxy_location="HeadOnly",
            controller_options=schema.controller_options,
        )
        client.deploy_apps(schema, _blocking=False)

    def deploy_extra(self, entry: dict[str, Any]) -> None:
        """Add one test app beside the session's apps and wait until it runs."""
        config = self.config()
        config["applications"].append(entry)
        self.apply(config)
        self.wait({entry["name"]: "RUNNING"})

    def remove_extras(self, timeout_s: float = 120) -> None:
        """Back to the session's apps only (Serve deletes the others); waits until they are gone."""
        from ray import serve

        extra = set(serve.status().applications) - {a["name"] for a in self.base_config["applications"]}
        self.apply(self.config())
        deadline = time.monotonic() + timeout_s
        while extra & set(serve.status().applications) and time.monotonic() < deadline:
            time.sleep(0.5)

    def wait(self, expected: dict[str, str], timeout_s: float = DEPLOY_TIMEOUT_S) -> dict[str, Any]:
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            apps = serve.status().applications
            if all(name in apps and apps[name].status == want for name, want in expected.items()):
                return apps
            failed = {
                n: apps[n].message
                for n, want in expected.items()
                if n in apps and apps[n].status == "DEPLOY_FAILED" and want != "DEPLOY_FAILED"
            }
            if failed:
                raise RuntimeError(f"apps failed to deploy: {failed}")
            time.sleep(0.5)
        raise TimeoutError(f"apps never reached {expected}: {serve.status().applications}")


def app_entry(name: str, route: str, model_args: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    entry = copy.deepcopy(template)
    entry["name"] = name
    entry["route_prefix"] = route
    entry["args"]["model"] = {**entry["args"]["model"], **model_args}
    for dep in entry["deployments"]:
        # Logical CPUs: three apps share this small machine during the tests.
        dep["ray_actor_options"]["num_cpus"] = min(dep["ray_actor_options"]["num_cpus"], 0.25)
    return entry


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models")
    build_classifier(repo)
    build_classifier(repo, version="2")  # a second version, for the blue-green and canary tests
    write_broken_embedder(repo)
    return repo


@pytest.fixture(scope="session")
def serve_harness(model_repo: Path) -> Iterator[ServeHarness]:
    import ray
    from ray import serve

    port = free_port()
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    # HAProxy's stats page and metrics listen on fixed ports (8404, 9101) by default: private ones here, so
    # that a `serve run` on this machine and the test session never take each other's.
    # (A config switched back to Serve's proxy, without controller_options, starts no HAProxy.)
    controller_env = ((config.get("controller_options") or {}).get("runtime_env") or {}).get("env_vars")
    if controller_env is not None:
        controller_env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(free_port())
        controller_env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(free_port())
    template = config["applications"][0]
    assert template["name"] == APP
    config["applications"].append(
        app_entry(
            CLASSIFY_APP,
            "/classify",
            {"repository": str(model_repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"},
            template,
        )
    )
    # Every request of the classify app is traced (test_logs_and_traces.py); the main app keeps the default.
    config["applications"][-1]["args"]["observability"] = {"trace_sample_ratio": 1.0}
    config["applications"].append(
        app_entry(
            BROKEN_APP,
            "/broken",
            {"repository": str(model_repo), "name": "broken-embedder", "backend": "torch"},
            template,
        )
    )
    # Dashboard on: it hosts the metrics agent (Prometheus endpoint) and the REST API `serve deploy` uses.
    # Logical GPUs (as `ray start --head --num-gpus=2` declares them) for the GPU scheduling tests; the
    # models still run on the CPU. Logical CPUs above the real two: the test apps are small.
    # address="local": always a new instance, never one a `ray start` left in /tmp/ray/ray_current_cluster.
    context = ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=True, log_to_driver=False)
    harness = ServeHarness(config, port, dashboard_url=f"http://{context.dashboard_url}")
    harness.apply(config)
    harness.wait({APP: "RUNNING", CLASSIFY_APP: "RUNNING", BROKEN_APP: "DEPLOY_FAILED"})
    yield harness
    serve.shutdown()
    ray.shutdown()


@pytest.fixture
def ingress_config(serve_harness: ServeHarness) -> Iterator[Callable[..., None]]:
    """Apply an Ingress user_config for one test, restore the shipped one afterwards."""

    def apply(**user_config: Any) -> None:
        def mutate(cfg: dict[str, Any]) -> None:
            ingress = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "Ingress")
            ingress["user_config"] = {**ingress.get("user_config", {}), **user_config}

        serve_harness.apply(serve_harness.config(mutate))
        time.sleep(3)  # reconfigure() runs on the live replica; no restart, nothing to wait for but it

    yield apply
    serve_harness.apply(serve_harness.config())
    serve_harness.wait({APP: "RUNNING"})


@pytest.fixture(scope="session")
def base_url(serve_harness: ServeHarness) -> str:
    return serve_harness.url


@pytest.fixture(scope="session")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="session")
def reference_model() -> Any:
    """sentence-transformers' own pipeline for the default model: the ground truth."""
    from sentence_transformers import SentenceTransformer

    from tests.support.models import DEFAULT_WEIGHTS

    return SentenceTransformer(str(DEFAULT_WEIGHTS), device="cpu")

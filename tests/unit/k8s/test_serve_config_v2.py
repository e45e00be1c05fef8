"""What each generated RayService serves: its Serve config plus the overlay, valid for Serve and textserve's
typed config, on Serve's proxy, with a GPU for every encoder model's Inference and every generate model's
Model."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from deployments.config import ModelAppArgs, RouterArgs
from deployments.tools.check import MODEL_APP, ROUTER, USER_CONFIGS
from deployments.tools.k8s_manifest import DEFAULTS, SELECTORS, selects, task_of
from tests.unit.k8s.conftest import ROOT, apps, cluster, containers, plain

GPU = "nvidia.com/gpu"
# Ray Serve's high-throughput mode (HAProxy); the cluster runs Serve's proxy (k8s/README.md "HTTP path").
THROUGHPUT_MODE = {"RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY"}


def _strip(config: dict[str, Any], patch: dict[str, Any]) -> None:
    """Remove from ``config`` every key the overlay sets, fills in or deletes (list items by selector)."""
    for key, value in patch.items():
        if isinstance(value, list):
            for item_patch in value:
                for item in config.get(key) or []:
                    if selects(item_patch, item):
                        own = {k: v for k, v in item_patch.items() if k not in (*SELECTORS, DEFAULTS)}
                        _strip(item, own)
                        _strip(item, item_patch.get(DEFAULTS) or {})
        elif isinstance(value, dict) and isinstance(config.get(key), dict):
            _strip(config[key], value)
            if not config[key]:
                del config[key]
        else:
            config.pop(key, None)


def test_cluster_serves_the_local_config_apart_from_the_overlay(
    serve_v2: dict[str, Any], local_config: dict[str, Any]
) -> None:
    overlay = plain(ROOT / "k8s/overlay.yaml")
    local, remote = copy.deepcopy(local_config), copy.deepcopy(serve_v2)
    _strip(local, overlay)
    _strip(remote, overlay)
    assert remote == local
    assert [a["name"] for a in serve_v2["applications"]] == [a["name"] for a in local_config["applications"]]


def test_serve_config_v2_is_plain_yaml(rayservice: dict[str, Any]) -> None:
    # The configs use anchors and merge keys; KubeRay and Serve get them resolved.
    events = list(yaml.parse(rayservice["spec"]["serveConfigV2"]))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)]
    assert "<<" not in rayservice["spec"]["serveConfigV2"]


def _unknown(data: dict[str, Any], model: type[BaseModel]) -> set[str]:
    return set(data) - set(model.model_fields)


def test_serve_config_v2_is_a_valid_serve_config(serve_v2: dict[str, Any]) -> None:
    from ray.serve.schema import (  # the schema only: no Ray is started
        DeploymentSchema,
        RayActorOptionsSchema,
        ServeApplicationSchema,
        ServeDeploySchema,
    )

    ServeDeploySchema.model_validate(serve_v2)
    # Serve's schema ignores unknown keys; a misspelt one would silently do nothing on the cluster.
    assert _unknown(serve_v2, ServeDeploySchema) == set()
    assert "http_options" not in serve_v2, "KubeRay's serve Service needs Serve's default host 0.0.0.0"
    for app in serve_v2["applications"]:
        assert _unknown(app, ServeApplicationSchema) == set(), app["name"]
        for deployment in app.get("deployments", []):
            assert _unknown(deployment, DeploymentSchema) == set(), deployment["name"]
            assert _unknown(deployment.get("ray_actor_options", {}), RayActorOptionsSchema) == set()
            user_config = USER_CONFIGS.get(deployment["name"].removeprefix("Candidate"))
            if user_config is not None and deployment.get("user_config") is not None:
                user_config.model_validate(deployment["user_config"])
    (router,) = apps(serve_v2, ROUTER)
    routed = RouterArgs.model_validate(router.get("args") or {}).models
    models = apps(serve_v2, MODEL_APP)
    assert routed == [a["name"] for a in models], "the router routes to exactly the model applications"
    for app in models:
        args = ModelAppArgs.model_validate(app.get("args") or {})
        # The overlay reached every model application, not only the first.
        assert args.model.device == "cuda", app["name"]
        assert args.model.task == "generate" or args.runtime.parallel_passes == 1, app["name"]


def test_every_application_runs_behind_serves_proxy(serve_v2: dict[str, Any]) -> None:
    assert "controller_options" not in serve_v2, "the controller would start HAProxy"
    assert serve_v2["proxy_location"] == "EveryNode"
    for app in serve_v2["applications"]:
        env = (app.get("runtime_env") or {}).get("env_vars") or {}
        assert not THROUGHPUT_MODE & set(env), app["name"]


def _gpus(group: dict[str, Any]) -> int:
    return sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in containers(group))


def _replicas(deployment: dict[str, Any], bound: str) -> int:
    if deployment.get("num_replicas", 1) != "auto" and "autoscaling_config" not in deployment:
        return deployment.get("num_replicas", 1)
    default = {"min_replicas": 1, "max_replicas": 100}[bound]  # Serve's defaults
    return deployment.get("autoscaling_config", {}).get(bound, default)


def test_every_model_runs_on_gpus_the_worker_group_has(
    rayservice: dict[str, Any], serve_v2: dict[str, Any]
) -> None:
    spec = cluster(rayservice)
    assert _gpus(spec["headGroupSpec"]) == 0, "the head is CPU only"
    capacity = sum(g["maxReplicas"] * _gpus(g) for g in spec["workerGroupSpecs"])
    assert capacity > 0, f"no worker group limits {GPU}"
    at_least = 0.0
    for app in apps(serve_v2, MODEL_APP):
        # Inference, and CandidateInference while a candidate version is served; a generate model's Model.
        runs_model = "Model" if task_of(app) == "generate" else "Inference"
        on_model = [d for d in app.get("deployments", []) if d["name"].endswith(runs_model)]
        names = [d["name"] for d in on_model]
        assert runs_model in names, app["name"]
        if (app.get("args") or {}).get("candidate"):
            # Unlisted, it would run with the code's defaults: no GPU on the cluster.
            assert "CandidateInference" in names, f"{app['name']}: list CandidateInference"
        for deployment in on_model:
            where = f"{app['name']}/{deployment['name']}"
            num_gpus = deployment.get("ray_actor_options", {}).get("num_gpus", 0)
            assert num_gpus > 0, f"{where} asks for no GPU"
            assert _replicas(deployment, "max_replicas") * num_gpus <= capacity, f"{where}: over capacity"
            at_least += _replicas(deployment, "min_replicas") * num_gpus
    # Every model must be able to start: their smallest footprints together fit the GPU workers.
    assert 0 < at_least <= capacity


SHIPPED_TARGET = next(
    d["autoscaling_config"]["target_ongoing_requests"]
    for a in yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]
    for d in a.get("deployments", [])
    if d["name"] == "Inference"
)


def test_the_cluster_autoscales_inference_on_the_configs_policy(
    serve_v2: dict[str, Any], local_config: dict[str, Any]
) -> None:
    local_apps = {a["name"]: a for a in local_config["applications"]}
    for app in apps(serve_v2, MODEL_APP):
        if task_of(app) == "generate":
            continue  # no Inference: one Model replica holds the engine and its KV cache
        (remote,) = [d for d in app["deployments"] if d["name"] == "Inference"]
        local = [d for d in local_apps[app["name"]].get("deployments", []) if d["name"] == "Inference"]
        policy = remote["autoscaling_config"]
        assert "num_replicas" not in remote and policy["max_replicas"] == 8, app["name"]
        # Where the config has a policy, its choices travel; where not, the overlay's defaults: the shipped
        # target (one ongoing call = one group of up to 64 requests), not Serve's default of 2.
        written = local[0].get("autoscaling_config", {}) if local else {}
        assert {k: v for k, v in written.items() if k != "max_replicas"}.items() <= policy.items()
        assert policy.get("target_ongoing_requests", 2) == SHIPPED_TARGET, app["name"]

"""The Kubernetes files: valid for the KubeRay CRDs, in sync with serve_config.yaml, matching the image."""

from __future__ import annotations

import copy
import functools
import re
from fnmatch import fnmatchcase
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator, FormatChecker
from packaging.specifiers import SpecifierSet
from pydantic import BaseModel

from deployments.config import AppArgs
from deployments.tools.check import BUILDER, USER_CONFIGS
from deployments.tools.k8s_manifest import load_yaml, render_files

ROOT = Path(__file__).resolve().parents[3]
# The KubeRay v1.7 CRDs, vendored (Apache-2.0; k8s/crds/README.md: where from, how to refresh).
CRD_DIR = ROOT / "k8s" / "crds"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
# spec.upgradeStrategy.type is a free string in the v1.7 CRD; these are the values the operator knows.
UPGRADE_TYPES = {"NewCluster", "NewClusterWithIncrementalUpgrade", "None"}
GPU = "nvidia.com/gpu"

FORMATS = FormatChecker()
FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -(2**31) <= v < 2**31)
FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**63)


def _closed(schema: Any) -> Any:
    """The schema with unknown fields rejected, as kubectl's strict field validation (the default) does.

    jsonschema allows extra properties unless told otherwise; Kubernetes only allows them where the CRD
    says x-kubernetes-preserve-unknown-fields or gives additionalProperties."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {name: _closed(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            out[key] = _closed(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_closed(sub) for sub in schema[key]]
    return out


@functools.cache
def crd_validator(kind: str, api_version: str) -> Draft7Validator:
    path = CRD_DIR / CRD_FILES[kind]
    if not path.is_file():
        pytest.fail(f"KubeRay CRD missing: {path} (vendored in k8s/crds/, see k8s/crds/README.md)")
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    group, _, wanted = api_version.partition("/")
    assert crd["spec"]["group"] == group, f"{path} is for {crd['spec']['group']}, not {group}"
    for entry in crd["spec"]["versions"]:
        if entry["name"] == wanted:
            return Draft7Validator(_closed(entry["schema"]["openAPIV3Schema"]), format_checker=FORMATS)
    pytest.fail(f"{path} has no version {wanted!r}")


def crd_errors(doc: dict[str, Any]) -> list[str]:
    validator = crd_validator(doc["kind"], doc["apiVersion"])
    errors = validator.iter_errors(doc)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((ROOT / "k8s").glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return docs


@pytest.fixture(scope="module")
def rayservice() -> dict[str, Any]:
    return load_yaml(ROOT / "k8s/rayservice.yaml")


@pytest.fixture(scope="module")
def serve_v2(rayservice: dict[str, Any]) -> dict[str, Any]:
    text = rayservice["spec"]["serveConfigV2"]
    assert isinstance(text, str), "KubeRay takes serveConfigV2 as a YAML string"
    return yaml.safe_load(text)


def cluster(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["rayClusterConfig"] if doc["kind"] == "RayService" else doc["spec"]


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def test_every_ray_document_validates_against_its_crd() -> None:
    docs = [(name, d) for name, d in k8s_documents() if d.get("kind") in CRD_FILES]
    assert {"rayservice.yaml", "rayservice.base.yaml"} <= {name for name, _ in docs}
    for name, doc in docs:
        assert crd_errors(doc) == [], f"{name} does not match the KubeRay CRD"


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    if value is KeyError:
        del doc[last]
    else:
        doc[last] = value


WORKER = "spec.rayClusterConfig.workerGroupSpecs.0"


@pytest.mark.parametrize(
    ("path", "value", "reported_at"),
    [
        (f"{WORKER}.minReplicas", "1", f"{WORKER}.minReplicas"),  # a string where the CRD wants int32
        (f"{WORKER}.maxReplicas", 2**40, f"{WORKER}.maxReplicas"),  # out of int32
        (f"{WORKER}.template", KeyError, WORKER),  # a required field gone
        ("spec.rayClusterConfig.headGroupSpec.rayStartParam", {}, "spec.rayClusterConfig.headGroupSpec"),
        (
            "spec.rayClusterConfig.enableInTreeAutoscaling",
            "true",
            "spec.rayClusterConfig.enableInTreeAutoscaling",
        ),
        ("spec.serveConfigV2", {"applications": []}, "spec.serveConfigV2"),  # structured, not a string
    ],
)
def test_broken_copies_are_rejected(
    rayservice: dict[str, Any], path: str, value: Any, reported_at: str
) -> None:
    broken = copy.deepcopy(rayservice)
    _set(broken, path, value)
    errors = crd_errors(broken)
    assert any(e.startswith(f"{reported_at}:") for e in errors), errors


def test_operator_rules_the_crd_leaves_open(rayservice: dict[str, Any]) -> None:
    strategy = rayservice["spec"]["upgradeStrategy"]
    assert strategy["type"] in UPGRADE_TYPES
    if strategy["type"] == "NewClusterWithIncrementalUpgrade":
        assert "clusterUpgradeOptions" in strategy
    for group in cluster(rayservice)["workerGroupSpecs"]:
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]


def _strip(config: dict[str, Any], patch: dict[str, Any]) -> None:
    """Remove from ``config`` every key the overlay sets or deletes (lists of named items matched by name)."""
    for key, value in patch.items():
        if isinstance(value, list):
            for item_patch in value:
                for item in config.get(key) or []:
                    if fnmatchcase(str(item.get("name")), item_patch["name"]):
                        _strip(item, {k: v for k, v in item_patch.items() if k != "name"})
        elif isinstance(value, dict) and isinstance(config.get(key), dict):
            _strip(config[key], value)
            if not config[key]:
                del config[key]
        else:
            config.pop(key, None)


def test_committed_rayservice_is_what_the_generator_makes() -> None:
    committed = (ROOT / "k8s/rayservice.yaml").read_text()
    assert committed == render_files(ROOT), (
        "k8s/rayservice.yaml drifted: python -m deployments.tools.k8s_manifest --write"
    )


def test_cluster_serves_the_local_config_apart_from_the_overlay(serve_v2: dict[str, Any]) -> None:
    local, overlay = load_yaml(ROOT / "serve_config.yaml"), load_yaml(ROOT / "k8s/overlay.yaml")
    remote = copy.deepcopy(serve_v2)
    _strip(local, overlay)
    _strip(remote, overlay)
    assert remote == local
    assert [a["name"] for a in remote["applications"]] == [a["name"] for a in local["applications"]]


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
        if app["import_path"] == BUILDER:
            AppArgs.model_validate(app.get("args") or {})
            for deployment in app.get("deployments", []):
                if deployment["name"] in USER_CONFIGS and deployment.get("user_config") is not None:
                    USER_CONFIGS[deployment["name"]].model_validate(deployment["user_config"])


def _pyproject(key: str) -> str:
    # A regex, not tomllib: the project supports Python 3.10, which has none.
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]+)"', text, re.MULTILINE)
    assert match, f"pyproject.toml has no {key}"
    return match.group(1)


def test_dockerfile_base_image_carries_the_installed_ray() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert len(bases) == 1, bases
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-(gpu|cu\d+)", bases[0])
    assert match, f"{bases[0]}: want an official GPU Ray image, rayproject/ray:<ray>-py<python>-gpu"
    ray_version, python_minor, _ = match.groups()
    assert ray_version == version("ray")
    assert f'"ray[serve]=={ray_version}"' in (ROOT / "pyproject.toml").read_text()
    assert SpecifierSet(_pyproject("requires-python")).contains(f"3.{python_minor}")
    assert "deployments.runtime.export_onnx" in dockerfile and "HF_HUB_OFFLINE=1" in dockerfile
    # Both exports are baked, so switching the cluster to fp16 is a config change (model.precision).
    assert "--precision fp16" in dockerfile


def test_rayservice_runs_the_image_the_dockerfile_builds(rayservice: dict[str, Any]) -> None:
    # Convention: the Dockerfile's image title is the image name, pyproject's version its tag (README).
    title = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', (ROOT / "Dockerfile").read_text())
    assert title, "the Dockerfile must name its image (LABEL org.opencontainers.image.title)"
    want = f"{title.group(1)}:{_pyproject('version')}"
    spec = cluster(rayservice)
    assert spec["rayVersion"] == version("ray")
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for container in containers(group):
            assert container["image"].rsplit("/", 1)[-1] == want, container["name"]


def _gpus(group: dict[str, Any]) -> int:
    return sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in containers(group))


def _model_deployments(app: dict[str, Any]) -> list[dict[str, Any]]:
    # Inference, and CandidateInference while a candidate version is served.
    return [d for d in app.get("deployments", []) if d["name"].endswith("Inference")]


def test_inference_asks_for_gpus_that_the_worker_group_has(
    rayservice: dict[str, Any], serve_v2: dict[str, Any]
) -> None:
    spec = cluster(rayservice)
    assert _gpus(spec["headGroupSpec"]) == 0, "the head is CPU only"
    gpu_groups = [g for g in spec["workerGroupSpecs"] if _gpus(g) > 0]
    assert gpu_groups, f"no worker group limits {GPU}"
    capacity = sum(g["maxReplicas"] * _gpus(g) for g in gpu_groups)
    for app in (a for a in serve_v2["applications"] if a["import_path"] == BUILDER):
        names = [d["name"] for d in _model_deployments(app)]
        assert "Inference" in names, app["name"]
        if (app.get("args") or {}).get("candidate"):
            # Unlisted, it would run with the code's defaults: no GPU on the cluster.
            assert "CandidateInference" in names, "list CandidateInference in serve_config.yaml"
        for deployment in _model_deployments(app):
            where = f"{app['name']}/{deployment['name']}"
            num_gpus = deployment.get("ray_actor_options", {}).get("num_gpus", 0)
            assert num_gpus > 0, f"{where} asks for no GPU"
            replicas = deployment.get("num_replicas", 1)
            if replicas == "auto" or "autoscaling_config" in deployment:
                replicas = deployment.get("autoscaling_config", {}).get(
                    "max_replicas", 100
                )  # Serve's default
            assert replicas * num_gpus <= capacity, f"{where}: more GPU replicas than the GPU workers hold"


def test_pod_monitor_scrapes_the_metrics_port_of_every_ray_pod(rayservice: dict[str, Any]) -> None:
    monitors = [d for _, d in k8s_documents() if d.get("kind") in ("PodMonitor", "ServiceMonitor")]
    assert monitors and all(m["apiVersion"] == "monitoring.coreos.com/v1" for m in monitors)
    spec = cluster(rayservice)
    for monitor in (m for m in monitors if m["kind"] == "PodMonitor"):
        wanted = dict(monitor["spec"]["selector"]["matchLabels"])
        assert wanted.pop("ray.io/is-ray-node", "yes") == "yes"  # KubeRay's own label on Ray pods
        ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
        for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            labels = group["template"]["metadata"]["labels"]
            assert wanted.items() <= labels.items()
            assert ports <= {p["name"] for c in containers(group) for p in c.get("ports", [])}
            assert group["rayStartParams"].get("metrics-export-port", "8080") == "8080"

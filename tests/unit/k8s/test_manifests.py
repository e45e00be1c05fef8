"""The Kubernetes files: valid for the KubeRay CRDs, in sync with their Serve configs, matching the image.

What the generated serveConfigV2 strings serve: test_serve_config_v2.py."""

from __future__ import annotations

import copy
import functools
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator, FormatChecker
from packaging.specifiers import SpecifierSet

from deployments.tools.k8s_manifest import render_files
from tests.unit.k8s.conftest import MANIFESTS, ROOT, cluster, containers

# The KubeRay v1.7 CRDs, vendored (Apache-2.0; k8s/crds/README.md: where from, how to refresh).
CRD_DIR = ROOT / "k8s" / "crds"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
# spec.upgradeStrategy.type is a free string in the v1.7 CRD; these are the values the operator knows.
UPGRADE_TYPES = {"NewCluster", "NewClusterWithIncrementalUpgrade", "None"}

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


def test_every_ray_document_validates_against_its_crd() -> None:
    docs = [(name, d) for name, d in k8s_documents() if d.get("kind") in CRD_FILES]
    assert {"rayservice.base.yaml", *(out.name for _, out in MANIFESTS)} <= {name for name, _ in docs}
    for name, doc in docs:
        assert crd_errors(doc) == [], f"{name} does not match the KubeRay CRD"
        # Optional in the CRD, required here: Ray's token (k8s/README.md, test_pod_security.py).
        assert (cluster(doc).get("authOptions") or {}).get("mode") == "token", f"{name}: no Ray token auth"


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
        ("spec.rayClusterConfig.authOptions.mode", "Token", "spec.rayClusterConfig.authOptions.mode"),  # enum
        ("spec.rayClusterConfig.authOptions.secret", "x", "spec.rayClusterConfig.authOptions"),  # secretName
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


def test_committed_rayservice_is_what_the_generator_makes(manifest: tuple[Path, Path]) -> None:
    config, out = manifest
    committed = (ROOT / out).read_text()
    assert committed == render_files(ROOT, config), (
        f"{out} drifted: python -m deployments.tools.k8s_manifest --write --all"
    )


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

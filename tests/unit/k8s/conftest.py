"""Every generated RayService (one per Serve config in ``k8s_manifest.GENERATED``) as a fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.tools.k8s_manifest import GENERATED, load_yaml, output_for

ROOT = Path(__file__).resolve().parents[3]
# (Serve config, the manifest made from it), both relative to ROOT.
MANIFESTS = [(config, output_for(config)) for config in GENERATED]


def plain(path: Path) -> dict[str, Any]:
    """A YAML file as plain data: anchors resolved, and no object shared between two places (an alias
    loads as the same object, which a test that edits one place would otherwise edit twice)."""
    return json.loads(json.dumps(load_yaml(path)))


@pytest.fixture(scope="module", params=MANIFESTS, ids=[out.name for _, out in MANIFESTS])
def manifest(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    return request.param


@pytest.fixture(scope="module")
def rayservice(manifest: tuple[Path, Path]) -> dict[str, Any]:
    return load_yaml(ROOT / manifest[1])


@pytest.fixture(scope="module")
def serve_v2(rayservice: dict[str, Any]) -> dict[str, Any]:
    text = rayservice["spec"]["serveConfigV2"]
    assert isinstance(text, str), "KubeRay takes serveConfigV2 as a YAML string"
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def local_config(manifest: tuple[Path, Path]) -> dict[str, Any]:
    return plain(ROOT / manifest[0])


def cluster(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["rayClusterConfig"] if doc["kind"] == "RayService" else doc["spec"]


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def apps(serve: dict[str, Any], import_path: str) -> list[dict[str, Any]]:
    return [a for a in serve["applications"] if a.get("import_path") == import_path]

"""Session-wide fixtures shared by unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime.export_onnx import export

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def default_model() -> ResolvedModel:
    return resolve_model(ModelConfig(), hash_files=False)


@pytest.fixture(scope="session")
def onnx_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding the default model and its fresh ONNX export (<version>/onnx/)."""
    repo = tmp_path_factory.mktemp("onnx-repo")
    version_dir = repo / "all-MiniLM-L6-v2" / "1"
    version_dir.mkdir(parents=True)
    manifest = (ROOT / "models/all-MiniLM-L6-v2/1/manifest.json").read_text()
    (version_dir / "manifest.json").write_text(manifest)
    export(version_dir, version_dir / "onnx")
    return repo


@pytest.fixture(scope="session")
def onnx_model(onnx_repository: Path) -> ResolvedModel:
    return resolve_model(ModelConfig(repository=str(onnx_repository), backend="onnx"), hash_files=True)

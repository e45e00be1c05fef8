"""Fixtures for the deployments unit tests: small model repositories in tmp dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.manifests import (
    CLASSIFIER_CONFIG,
    CLASSIFY_MANIFEST,
    EMBED_MANIFEST,
    _copy_small_files,
    _model_dir,
    _write_manifest,
)
from tests.support.tenants import clock, tenants  # noqa: F401  (fixtures of the access tests)


@pytest.fixture
def embed_repo(tmp_path: Path) -> Path:
    """A valid embed model (small files only) at <repo>/tiny-embedder/3/; returns the model dir."""
    d = _model_dir(tmp_path)
    _copy_small_files(d)
    _write_manifest(d, EMBED_MANIFEST)
    return d


@pytest.fixture
def classify_repo(tmp_path: Path) -> Path:
    d = _model_dir(tmp_path)
    _copy_small_files(d, ("tokenizer.json",))
    (d / "config.json").write_text(json.dumps(CLASSIFIER_CONFIG), encoding="utf-8")
    _write_manifest(d, CLASSIFY_MANIFEST)
    return d

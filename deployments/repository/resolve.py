"""Resolve the configured model from the model repository, refusing anything that does not check out."""

from __future__ import annotations

from pathlib import Path

from deployments.config import ModelConfig
from deployments.repository.manifest import (
    Manifest,
    ManifestError,
    ResolvedModel,
    load_manifest,
    weights_dir_of,
)
from deployments.repository.weights_check import check_weights


def check_against_config(manifest: Manifest, config: ModelConfig, path: Path) -> None:
    for field in ("name", "version", "task"):
        want, have = getattr(config, field), getattr(manifest, field)
        if want != have:
            raise ManifestError(field, f"config asks for {want!r} but the manifest says {have!r}", path)
    wanted_format = {"torch": "transformers", "onnx": "onnx"}[config.backend]
    if wanted_format != manifest.format:
        raise ManifestError(
            "format",
            f"config asks for backend {config.backend!r} but the model's format is {manifest.format!r}",
            path,
        )
    # Torch casts its weights at load time; an ONNX graph is what it was exported as.
    if manifest.format == "onnx" and manifest.precision != config.precision:
        raise ManifestError(
            "precision",
            f"config asks for {config.precision!r} but the ONNX model is {manifest.precision!r}",
            path,
        )


def resolve_model(config: ModelConfig, *, hash_files: bool = True) -> ResolvedModel:
    """Load the configured model's manifest and check it against the config and its weights."""
    path = config.manifest_path()
    manifest = load_manifest(path)
    check_against_config(manifest, config, path)
    weights = weights_dir_of(manifest, path)
    check_weights(manifest, weights, path, hash_files)
    return ResolvedModel(
        manifest=manifest, manifest_path=path, weights_dir=weights, precision=config.precision
    )


def recheck_on_replica(model: ResolvedModel, hash_files: bool) -> None:
    """A replica may run on another node than the one that built the app: check its own files too."""
    check_weights(model.manifest, model.weights_dir, model.manifest_path, hash_files)

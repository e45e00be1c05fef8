"""Half precision: torch weights cast at load, ONNX fp16 exports, and the config/manifest checks around them.
Measured against the fp32 torch model on what users receive, across padded batches of mixed lengths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from deployments.config import ModelAppArgs, ModelConfig
from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.runtime.batching import BatchLimits
from deployments.runtime.export_onnx import export
from preprocess.tokenize import TextTokenizer
from tests.support.vectors import row_cosines

MIN_COSINE_HALF = 0.999
TEXTS = [
    "Short.",
    "A sentence of middling length about batching requests by length.",
    "Serving transformer models well means sorting requests by length so that little compute goes to "
    "padding, and keeping the latency of every single request low, even under heavy load. " * 3,
]


@pytest.fixture(scope="module")
def sequences(default_model: ResolvedModel) -> list[np.ndarray]:
    tok = TextTokenizer(default_model.tokenizer_file, 256)
    return list(tok.encode(TEXTS * 4, truncate=True).sequences())


@pytest.fixture(scope="module")
def reference(default_model: ResolvedModel, sequences: list[np.ndarray]) -> np.ndarray:
    return create_runner(default_model, "cpu").run(sequences, BatchLimits(32, 8192)).values


@pytest.fixture(scope="module")
def fp16_repository(onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ONNX repository's model with an fp16 export beside the fp32 one (<version>/onnx-fp16/)."""
    repo = tmp_path_factory.mktemp("fp16-repo")
    shutil.copytree(onnx_repository, repo, dirs_exist_ok=True)
    version_dir = repo / "all-MiniLM-L6-v2" / "1"
    export(version_dir, version_dir / "onnx-fp16", precision="fp16")
    return repo


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_torch_weights_cast_at_load(default_model, sequences, reference, precision) -> None:
    model = resolve_model(ModelConfig(precision=precision), hash_files=False)
    assert model.precision == precision
    runner = create_runner(model, "cpu")
    assert next(runner.model.parameters()).dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    got = runner.run(sequences, BatchLimits(5, 8192))  # padded micro-batches of mixed lengths
    assert got.values.dtype == np.float32  # users get float32 whatever the compute precision
    assert row_cosines(got.values, reference).min() >= MIN_COSINE_HALF
    assert row_cosines(got.values, reference).min() < 1.0 - 1e-7  # it really ran in half precision


def test_onnx_fp16_export_serves_the_same_vectors(fp16_repository, sequences, reference) -> None:
    config = ModelConfig(repository=str(fp16_repository), backend="onnx", precision="fp16")
    assert config.manifest_path().parent.name == "onnx-fp16"
    model = resolve_model(config, hash_files=True)
    assert model.manifest.precision == "fp16" and model.manifest.format == "onnx"
    fp32_file = fp16_repository / "all-MiniLM-L6-v2" / "1" / "onnx" / "model.onnx"
    assert model.onnx_file.stat().st_size < 0.6 * fp32_file.stat().st_size  # half-size weights
    got = create_runner(model, "cpu").run(sequences, BatchLimits(5, 8192))
    assert got.values.dtype == np.float32
    assert row_cosines(got.values, reference).min() >= MIN_COSINE_HALF


def test_onnx_precision_must_match_the_export(fp16_repository) -> None:
    # Config fp16 pointed at an fp32 export (a copied or hand-edited directory): refused, naming the field.
    version_dir = fp16_repository / "all-MiniLM-L6-v2" / "1"
    manifest = json.loads((version_dir / "onnx-fp16" / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    (version_dir / "onnx-fp16" / "manifest.json").write_text(json.dumps({**manifest, "precision": "fp32"}))
    try:
        with pytest.raises(ManifestError) as err:
            resolve_model(ModelConfig(repository=str(fp16_repository), backend="onnx", precision="fp16"))
        assert err.value.field == "precision"
    finally:
        (version_dir / "onnx-fp16" / "manifest.json").write_text(json.dumps(manifest))


def test_config_paths_and_refusals() -> None:
    assert ModelConfig(backend="onnx").manifest_path().parent.name == "onnx"
    assert ModelConfig(backend="onnx", precision="fp16").manifest_path().parent.name == "onnx-fp16"
    assert ModelConfig(precision="fp16").manifest_path().parent.name == "1"  # torch: the HF weights
    with pytest.raises(ValidationError, match="bf16 needs backend torch"):
        ModelConfig(backend="onnx", precision="bf16")
    with pytest.raises(ValidationError):
        ModelAppArgs.model_validate({"model": {"precision": "int8"}})


def test_export_refuses_a_precision_it_cannot_make(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="fp32 or fp16"):
        export(tmp_path, tmp_path / "out", precision="bf16")

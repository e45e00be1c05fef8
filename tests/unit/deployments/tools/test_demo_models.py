"""The demo models: built offline, accepted by the service's own resolve and runner code, tamper-checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import ManifestError, sha256_of
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.tools import demo_models
from deployments.tools.demo_models import DEMOS, VERSION, DemoSpec, build, stale_reason
from preprocess.tokenize import TextTokenizer

TEXTS = ["short", "a somewhat longer sentence with several more words in it", "Ünïcödé 日本語 🚀"]
SPECS = {spec.task: spec for spec in DEMOS}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("demo-repo")
    for spec in DEMOS:
        assert build(spec, repo).startswith(f"built {spec.name}")
    return repo


def _config(repo: Path, spec: DemoSpec, **kw: Any) -> ModelConfig:
    kw.setdefault("task", spec.task)
    return ModelConfig(repository=str(repo), name=spec.name, version=VERSION, **kw)


def _copy(repository: Path, spec: DemoSpec, tmp_path: Path) -> Path:
    """The torch version dir of a built demo, copied (without its ONNX export) into a fresh repository."""
    target = tmp_path / spec.name / VERSION
    shutil.copytree(repository / spec.name / VERSION, target, ignore=shutil.ignore_patterns("onnx"))
    return target


def _edit_manifest(version_dir: Path, **changes: Any) -> None:
    path = version_dir / "manifest.json"
    manifest = json.loads(path.read_text()) | changes
    path.write_text(json.dumps(manifest))


def _refused(config: ModelConfig, field: str) -> None:
    with pytest.raises(ManifestError) as info:
        resolve_model(config, hash_files=True)
    assert info.value.field == field, f"expected field {field!r}, got {info.value.field!r}: {info.value}"
    assert f"manifest field '{field}'" in str(info.value)


def test_the_demos_are_marked_and_differ_from_the_default_model():
    names = ["demo-sentiment-classifier", "demo-mini-embedder", "demo-cross-encoder", "demo-splade"]
    assert [s.name for s in DEMOS] == names
    assert SPECS["classify"].labels == ("negative", "neutral", "positive")
    assert SPECS["embed"].hidden == 256 != 384  # MiniLM's dimension
    assert all(s.layers == 2 for s in DEMOS)


def test_retrieval_demos_run_on_torch_and_refuse_onnx(repository: Path):
    cross = resolve_model(_config(repository, SPECS["rerank"]), hash_files=True)
    assert cross.manifest.activation == "sigmoid" and cross.output_size == 1
    sparse = resolve_model(_config(repository, SPECS["sparse_embed"]), hash_files=True)
    assert sparse.output_size == sparse.manifest.output.dimension == 30522
    tokenizer = TextTokenizer(sparse.tokenizer_file, sparse.manifest.input.max_tokens)
    weights = create_runner(sparse, device="cpu").run(list(tokenizer.encode(TEXTS).sequences())).values
    assert weights.shape == (3, 30522) and (weights >= 0).all() and (weights > 0).any()
    with pytest.raises(ValueError, match="backend torch"):
        _config(repository, SPECS["rerank"], backend="onnx")


def test_the_embedding_demo_declares_prompts_matryoshka_and_int8_ranges(repository: Path):
    model = resolve_model(_config(repository, SPECS["embed"]), hash_files=True).manifest
    assert model.prompts == {"query": "query: ", "document": "passage: "}
    assert model.matryoshka_dimensions == (64, 128)
    assert model.quantization is not None and len(model.quantization.ranges[0]) == 256


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("task", ["embed", "classify"])
def test_service_resolves_and_runs_each_demo(repository: Path, task: str, backend: str):
    spec = SPECS[task]
    model = resolve_model(_config(repository, spec, backend=backend), hash_files=True)
    assert model.manifest.name == spec.name and model.manifest.input.max_tokens == spec.max_tokens
    tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    runner = create_runner(model, device="cpu", threads=1)
    values = runner.run(list(tokenizer.encode(TEXTS).sequences())).values
    if task == "embed":
        assert model.manifest.output.dimension == 256 and model.manifest.pooling == "mean"
        assert values.shape == (len(TEXTS), 256)
        np.testing.assert_allclose(np.linalg.norm(values, axis=1), 1.0, atol=1e-5)  # normalize: true
    else:
        assert model.manifest.output.labels == spec.labels
        assert values.shape == (len(TEXTS), len(spec.labels))
        np.testing.assert_allclose(values.sum(axis=1), 1.0, atol=1e-5)  # softmax scores


def test_second_run_keeps_what_checks_out(repository: Path, capsys: pytest.CaptureFixture[str]):
    sums = {s.name: sha256_of(repository / s.name / VERSION / "model.safetensors") for s in DEMOS}
    demo_models.main(["--repository", str(repository)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["kept", s.name] for s in DEMOS]
    assert sums == {s.name: sha256_of(repository / s.name / VERSION / "model.safetensors") for s in DEMOS}


def test_weights_are_deterministic(repository: Path, tmp_path: Path):
    spec = SPECS["classify"]
    assert build(spec, tmp_path, onnx=False).startswith("built")
    file = f"{spec.name}/{VERSION}/model.safetensors"
    assert sha256_of(tmp_path / file) == sha256_of(repository / file)


def test_wrong_dimension_is_refused(repository: Path, tmp_path: Path):
    spec = SPECS["embed"]
    extras = {
        "quantization": None,
        "matryoshka_dimensions": None,
    }  # sized to 256: this test is about the weights
    _edit_manifest(_copy(repository, spec, tmp_path), output={"dimension": 384}, **extras)
    _refused(_config(tmp_path, spec), "output.dimension")


def test_wrong_task_is_refused(repository: Path, tmp_path: Path):
    spec = SPECS["embed"]  # an embedder's manifest claiming to classify: its weights have no head
    extras = {"quantization": None, "matryoshka_dimensions": None}  # an embedding model's own fields
    _edit_manifest(
        _copy(repository, spec, tmp_path), task="classify", output={"labels": ["a", "b"]}, **extras
    )
    _refused(_config(tmp_path, spec, task="classify"), "task")


def test_config_asking_another_task_is_refused(repository: Path):
    _refused(_config(repository, SPECS["classify"], task="embed"), "task")


def test_wrong_labels_are_refused(repository: Path, tmp_path: Path):
    spec = SPECS["classify"]
    _edit_manifest(_copy(repository, spec, tmp_path), output={"labels": ["negative", "positive"]})
    _refused(_config(tmp_path, spec), "output.labels")


def test_changed_weights_are_refused_then_rebuilt(repository: Path, tmp_path: Path):
    spec = SPECS["classify"]
    weights = _copy(repository, spec, tmp_path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    _refused(_config(tmp_path, spec), "files.model.safetensors")
    assert "files.model.safetensors" in (stale_reason(spec, weights.parent, onnx=False) or "")
    assert build(spec, tmp_path, onnx=False).startswith(f"built {spec.name} v1 (rebuilt:")
    assert resolve_model(_config(tmp_path, spec), hash_files=True).manifest.name == spec.name

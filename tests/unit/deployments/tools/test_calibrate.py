"""deployments/tools/calibrate.py: int8/uint8 ranges over the corpus, written into the manifest."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from deployments.repository.manifest import load_manifest
from deployments.tools import calibrate as cal

DIM = 4


def _model_dir(tmp_path: Path, task: str = "embed") -> Path:
    manifest = {
        "schema_version": 1,
        "name": "tiny",
        "version": "1",
        "task": task,
        "input": {"max_tokens": 16},
        "output": {"dimension": DIM},
        "pooling": "mean",
        "normalize": True,
    }
    if task == "generate":
        manifest.update(output={}, pooling=None, normalize=False)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return tmp_path


def test_ranges_over_the_corpus_are_written_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_embed(model: object, texts: list[str]) -> np.ndarray:
        seen.append(texts)
        return np.random.default_rng(0).normal(size=(len(texts), DIM)).astype(np.float32)

    monkeypatch.setattr(cal, "embed_corpus", fake_embed)
    model_dir = _model_dir(tmp_path)
    ranges = cal.calibrate(model_dir, count=50)
    assert len(seen[0]) == 50 and all(isinstance(t, str) and t for t in seen[0])
    assert ranges.shape == (2, DIM) and (ranges[0] <= ranges[1]).all()
    manifest = load_manifest(model_dir / "manifest.json")
    assert manifest.quantization is not None
    assert np.allclose(np.asarray(manifest.quantization.ranges), ranges)
    assert manifest.quantization.corpus.startswith("50 texts of deployments/tools/corpus.py")
    text = (model_dir / "manifest.json").read_text()
    assert all(json.dumps(row) in text for row in ranges.tolist())  # each row on one line


def test_only_embedding_models_are_calibrated(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="only embedding models"):
        cal.calibrate(_model_dir(tmp_path, task="generate"))


def test_dumps_manifest_without_ranges_is_plain_json() -> None:
    assert json.loads(cal.dumps_manifest({"name": "x"})) == {"name": "x"}


def test_the_tool_needs_no_bench() -> None:
    # The wheel ships no bench/: the tool takes its corpus from deployments.tools.corpus.
    tree = ast.parse(Path(cal.__file__).read_text())
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m.split(".")[0] == "bench"]

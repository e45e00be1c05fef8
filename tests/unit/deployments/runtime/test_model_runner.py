"""Both backends in process (no Ray): sentence-transformers parity, padding invariance, order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from deployments.config import ModelConfig
from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.runtime.batching import BatchLimits
from deployments.runtime.runner_base import BatchRunner
from deployments.runtime.torch_runner import ModelRunner, pick_device
from preprocess.tokenize import TextTokenizer
from tests.support.models import LABELS, build_classifier

TEXTS = [
    "short",
    "a somewhat longer sentence with several more words in it",
    "Ünïcödé and 日本語 and emoji 🚀",
    "medium length text here",
]


@pytest.fixture(scope="module", params=["torch", "onnx"])
def runner(request, default_model: ResolvedModel) -> BatchRunner:
    model = default_model if request.param == "torch" else request.getfixturevalue("onnx_model")
    return create_runner(model, device="cpu")


@pytest.fixture(scope="module")
def tokenizer(default_model: ResolvedModel) -> TextTokenizer:
    return TextTokenizer(default_model.tokenizer_file, 256)


def test_pick_device_falls_back_to_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected
    assert pick_device("cpu").type == "cpu"


def test_backend_comes_from_manifest(runner, default_model):
    assert runner.backend in ("torch", "onnx") and runner.device_name == "cpu"
    assert runner.output_size == 384


def test_matches_sentence_transformers(runner, tokenizer, default_model):
    from sentence_transformers import SentenceTransformer

    ours = runner.run(list(tokenizer.encode(TEXTS).sequences())).values
    ref = SentenceTransformer(str(default_model.weights_dir), device="cpu").encode(TEXTS)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("max_batch", [1, 2, 3, 32])
def test_padding_and_micro_batching_do_not_change_results(runner, tokenizer, max_batch):
    seqs = list(tokenizer.encode(TEXTS).sequences())
    alone = np.stack([runner.run([s]).values[0] for s in seqs])
    result = runner.run(seqs, BatchLimits(max_sequences=max_batch, max_tokens=4096))
    assert result.values.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(result.values, alone, atol=2e-5)  # same rows, same input order
    assert result.micro_batches == -(-len(TEXTS) // max_batch)
    assert 0 < result.padding_efficiency <= 1


def test_empty_input_gives_empty_output(runner):
    result = runner.run([])
    assert result.values.shape == (0, 384) and result.micro_batches == 0


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
    clf = create_runner(model, device="cpu")
    clf.warm_up(max_tokens=128, max_batch=4)
    probs = clf.run(list(tokenizer.encode(TEXTS).sequences()), BatchLimits(2, 1024)).values
    assert probs.shape == (len(TEXTS), len(LABELS))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert (probs > 0).all()

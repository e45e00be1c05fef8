"""ONNX Runtime vs torch on what users receive (pooled, normalized embeddings): cosine >= 0.9999
across batch sizes 1-32 and lengths 1-256 tokens, heavily padded batches included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import ManifestError
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.runtime.batching import BatchLimits
from deployments.runtime.export_onnx import export
from deployments.runtime.runner_base import BatchRunner
from preprocess.tokenize import TextTokenizer
from tests.support.models import build_classifier

MIN_COSINE = 0.9999
PROSE = (
    "Serving transformer models well means batching requests, sorting them by length so that "
    "little compute goes to padding, and keeping the latency of every single request low. "
) * 12


@pytest.fixture(scope="module")
def runners(default_model, onnx_model) -> tuple[BatchRunner, BatchRunner]:
    return create_runner(default_model, "cpu"), create_runner(onnx_model, "cpu")


@pytest.fixture(scope="module")
def corpus_ids(default_model) -> np.ndarray:
    tok = TextTokenizer(default_model.tokenizer_file, 256)
    return next(tok.encode([PROSE], truncate=True).sequences())


def _seq(ids: np.ndarray, length: int) -> np.ndarray:
    # Real token ids, cut to `length` with [SEP] kept last (length 1 is just [CLS]).
    return ids[:length].copy() if length < 2 else np.concatenate([ids[: length - 1], ids[-1:]])


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("batch", [1, 2, 7, 16, 32])
def test_mixed_lengths_padded_batches(runners, corpus_ids, batch):
    rng = np.random.default_rng(batch)
    lengths = rng.integers(1, 257, size=batch)
    lengths[0] = 256  # every batch padded up to the limit
    seqs = [_seq(corpus_ids, int(n)) for n in lengths]
    torch_runner, onnx_runner = runners
    # One unsorted padded batch straight through each backend: maximal padding.
    ids, mask = torch_runner._pad(seqs, 256)
    assert _cos(torch_runner._forward(ids, mask), onnx_runner._forward(ids, mask)).min() >= MIN_COSINE
    # And through the public path (sorted micro-batches).
    limits = BatchLimits(max_sequences=32, max_tokens=256 * 32)
    got = onnx_runner.run(seqs, limits).values
    want = torch_runner.run(seqs, limits).values
    assert _cos(got, want).min() >= MIN_COSINE


@pytest.mark.parametrize("length", [1, 2, 3, 8, 64, 128, 255, 256])
def test_each_length_alone(runners, corpus_ids, length):
    torch_runner, onnx_runner = runners
    seq = [_seq(corpus_ids, length)]
    assert _cos(onnx_runner.run(seq).values, torch_runner.run(seq).values).min() >= MIN_COSINE


def test_classifier_export_parity(tmp_path: Path, corpus_ids):
    build_classifier(tmp_path)
    export(tmp_path / "tiny-sentiment" / "1", tmp_path / "tiny-sentiment" / "1" / "onnx")
    config = ModelConfig(repository=str(tmp_path), name="tiny-sentiment", task="classify")
    torch_runner = create_runner(resolve_model(config), "cpu")
    onnx_runner = create_runner(resolve_model(config.model_copy(update={"backend": "onnx"})), "cpu")
    seqs = [_seq(corpus_ids, n) for n in (1, 5, 40, 128)]
    np.testing.assert_allclose(onnx_runner.run(seqs).values, torch_runner.run(seqs).values, atol=1e-4)


def test_backend_must_match_manifest_format(onnx_model, tmp_path: Path):
    # An ONNX manifest where the config expects Hugging Face weights (backend torch) is refused.
    target = tmp_path / "all-MiniLM-L6-v2" / "1"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(onnx_model.manifest_path.read_text())
    with pytest.raises(ManifestError) as info:
        resolve_model(ModelConfig(repository=str(tmp_path), backend="torch"), hash_files=False)
    assert info.value.field == "format"

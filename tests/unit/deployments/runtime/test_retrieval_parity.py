"""The retrieval tasks against sentence-transformers, on locally built models (no Ray, fp32):
cross-encoder scores (CrossEncoder.predict), prompts (encode(prompt_name=...)), SPLADE weights
(SparseEncoder with MLMTransformer + SpladePooling), and rerank by cosine (util.cos_sim)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contracts.outputs import SparseRows
from deployments.config import ModelConfig
from deployments.pipeline.group_runner import OutputMaker
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.tools.demo_models import DEMOS, VERSION, build
from postprocess.retrieval import rerank_scores
from preprocess.prompts import rerank_job
from preprocess.tokenize import TextTokenizer, encode_job

SPECS = {spec.task: spec for spec in DEMOS}
QUERY = "how do cats purr"
DOCS = [
    "Cats purr by vibrating the muscles of the larynx.",
    "The stock market fell sharply on Tuesday.",
    "A domestic cat may purr when content, and also when in pain or stressed.",
    "purr",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("retrieval-demos")
    for task in ("embed", "rerank", "sparse_embed"):
        assert build(SPECS[task], repo, onnx=False).startswith("built")
    return repo


def _model(repo: Path, task: str, graph_precision: str = "fp32") -> ResolvedModel:
    spec = SPECS[task]
    config = ModelConfig(repository=str(repo), name=spec.name, version=VERSION, task=task, precision="fp32")
    return resolve_model(config, hash_files=True)


def _outputs(model: ResolvedModel, job, graph: str = "trace"):
    tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    encoded = encode_job(tokenizer, job, pairs=model.manifest.task == "rerank")
    runner = create_runner(model, "cpu", graph=graph)
    return OutputMaker.of(model)(encoded, runner.run(list(encoded.sequences())).values)


@pytest.mark.parametrize("graph", ["eager", "trace"])
def test_cross_encoder_scores_equal_crossencoder_predict(repo: Path, graph: str):
    from sentence_transformers import CrossEncoder

    model = _model(repo, "rerank")
    job = rerank_job("rerank", {}, QUERY, DOCS, True, None)
    got = rerank_scores(_outputs(model, job, graph))
    want = CrossEncoder(str(model.weights_dir), device="cpu").predict([(QUERY, d) for d in DOCS])
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.ptp(want) > 1e-3  # the pairs score differently, so the check can fail


def test_cross_encoder_uses_segment_ids(repo: Path):
    """Without token type ids (all zero) the demo's scores differ: the check above needs them."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = _model(repo, "rerank")
    hf = AutoModelForSequenceClassification.from_pretrained(str(model.weights_dir)).eval()
    batch = AutoTokenizer.from_pretrained(str(model.weights_dir))(
        [QUERY] * 4, DOCS, padding=True, return_tensors="pt"
    )
    with torch.inference_mode():
        with_types = hf(**batch).logits[:, 0]
        without = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
    assert (with_types - without).abs().max() > 1e-3
    got = rerank_scores(_outputs(model, rerank_job("rerank", {}, QUERY, DOCS, True, None)), raw=True)
    np.testing.assert_allclose(got, with_types.numpy(), atol=1e-4)


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_prompts_equal_sentence_transformers_encode_prompt_name(repo: Path, prompt_name: str):
    from sentence_transformers import SentenceTransformer

    from contracts.tokenized import TokenizeJob

    model = _model(repo, "embed")
    prompt = model.manifest.prompts[prompt_name]
    got = _outputs(model, TokenizeJob(DOCS, prompt=prompt)).values
    st = SentenceTransformer(str(model.weights_dir), device="cpu")
    want = st.encode(DOCS, prompt_name=prompt_name, convert_to_numpy=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    plain = st.encode(DOCS, convert_to_numpy=True)
    assert np.abs(plain - want).max() > 1e-3  # the prompt changes the vectors


def test_splade_weights_equal_sparse_encoder(repo: Path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    from contracts.tokenized import TokenizeJob

    model = _model(repo, "sparse_embed")
    got = _outputs(model, TokenizeJob(DOCS)).values
    assert isinstance(got, SparseRows)  # the form it leaves the inference replica in
    mlm = MLMTransformer(str(model.weights_dir), max_seq_length=model.manifest.input.max_tokens)
    reference = SparseEncoder(modules=[mlm, SpladePooling("max")], device="cpu")
    want = reference.encode(DOCS, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(got.dense(), want, atol=1e-4, rtol=1e-4)
    assert (want > 0).sum() > 0


def test_minilm_rerank_scores_equal_cos_sim(default_model: ResolvedModel):
    from sentence_transformers import SentenceTransformer, util

    job = rerank_job("embed", {}, QUERY, DOCS, True, None)
    got = rerank_scores(_outputs(default_model, job))
    st = SentenceTransformer(str(default_model.weights_dir), device="cpu")
    want = util.cos_sim(st.encode([QUERY]), st.encode(DOCS)).numpy()[0]
    np.testing.assert_allclose(got, want, atol=2e-3)
    assert np.argsort(-got).tolist() == np.argsort(-want).tolist()

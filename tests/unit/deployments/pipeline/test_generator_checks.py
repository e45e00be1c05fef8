"""A generate model the engine could not serve is refused at start, with the settings to change named."""

from __future__ import annotations

import pytest

from deployments.app import build_model
from deployments.config import GenerationConfig, ModelConfig, SpeculativeConfig
from deployments.pipeline.generator import check_generation
from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.repository.resolve import resolve_model

NGRAM = SpeculativeConfig(method="ngram", tokens=4)


@pytest.fixture(scope="module")
def lm() -> ResolvedModel:
    return resolve_model(ModelConfig(name="demo-gpt2-lm", task="generate"), hash_files=False)


def test_a_budget_below_one_whole_context_is_refused(lm: ResolvedModel) -> None:
    context = lm.manifest.input.max_tokens
    with pytest.raises(ValueError, match=r"generation.kv_cache_tokens \(100\).*input.max_tokens: 512"):
        check_generation(lm, GenerationConfig(kv_cache_tokens=100), None)
    check_generation(lm, GenerationConfig(kv_cache_tokens=context), None)  # exactly one: served


def test_speculative_tokens_count_in_the_budget(lm: ResolvedModel) -> None:
    context = lm.manifest.input.max_tokens
    with pytest.raises(ValueError, match=r"generation.speculative.tokens: 4"):
        check_generation(lm, GenerationConfig(kv_cache_tokens=context + 3, speculative=NGRAM), None)
    check_generation(lm, GenerationConfig(kv_cache_tokens=context + 4, speculative=NGRAM), None)


def test_a_draft_with_another_tokenizer_is_refused(lm: ResolvedModel, onnx_model: ResolvedModel) -> None:
    with pytest.raises(ManifestError, match="another tokenizer"):
        check_generation(lm, GenerationConfig(), onnx_model)
    same = resolve_model(ModelConfig(name="demo-llama-lm", task="generate"), hash_files=False)
    assert same.tokenizer_id == lm.tokenizer_id  # the demos share one tokenizer: a valid draft
    check_generation(lm, GenerationConfig(), same)


def test_the_application_is_refused_before_any_replica_starts() -> None:
    args = {"model": {"name": "demo-gpt2-lm", "task": "generate"}, "generation": {"kv_cache_tokens": 64}}
    with pytest.raises(ValueError, match="cannot hold one request of the model's whole context"):
        build_model(args)
    draft = {"method": "draft", "draft": {"name": "demo-llama-lm"}}
    assert build_model({"model": args["model"], "generation": {"speculative": draft}}) is not None

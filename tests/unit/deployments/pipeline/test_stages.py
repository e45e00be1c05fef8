"""The tokenizer and serializer deployments' classes, called directly (no Ray): small groups run on the
event loop, large ones on the stage's own threads, with the same answers either way."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from contracts.errors import InputTooLongError, ServiceError
from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions
from contracts.tokenized import EncodedTexts, TokenizeJob
from deployments.config import ObservabilityConfig
from deployments.pipeline import stages
from deployments.repository.manifest import ResolvedModel

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "


def _run_and_note_thread(obj: Any, method: str, *args: Any) -> tuple[Any, str]:
    """Calls the async stage method on a fresh loop; returns its result and the thread the work ran on."""
    seen: list[str] = []
    work = getattr(obj._work, method)

    def noting(*a: Any) -> Any:
        seen.append(threading.current_thread().name)
        return work(*a)

    setattr(obj._work, method, noting)
    try:
        result = asyncio.run(getattr(obj, method)(*args))
    finally:
        delattr(obj._work, method)
    assert len(seen) == 1
    return result, seen[0]


@pytest.fixture(scope="module")
def tokenizer(default_model: ResolvedModel) -> Any:
    return stages.TokenizerDeployment.func_or_class(default_model, ObservabilityConfig())


@pytest.fixture(scope="module")
def serializer() -> Any:
    return stages.SerializerDeployment.func_or_class(ObservabilityConfig(), [])


def test_a_small_group_is_tokenized_on_the_event_loop(tokenizer: Any) -> None:
    jobs = [TokenizeJob([SENTENCE]) for _ in range(8)]
    results, thread = _run_and_note_thread(tokenizer, "encode", jobs)
    assert thread == threading.main_thread().name  # asyncio.run's loop runs on this thread
    assert [len(r) for r in results] == [1] * 8


def test_a_large_group_is_tokenized_on_the_stage_threads_with_the_same_answers(tokenizer: Any) -> None:
    texts = [SENTENCE * 4] * 80  # over ON_LOOP_CHARS in all
    assert sum(map(len, texts)) > stages.ON_LOOP_CHARS
    jobs = [TokenizeJob(texts[i : i + 8]) for i in range(0, len(texts), 8)]
    results, thread = _run_and_note_thread(tokenizer, "encode", jobs)
    assert thread.startswith("tokenize")
    small, _ = _run_and_note_thread(tokenizer, "encode", [TokenizeJob(texts[:8])])
    assert isinstance(results[0], EncodedTexts) and isinstance(small[0], EncodedTexts)
    np.testing.assert_array_equal(results[0].ids, small[0].ids)
    assert len(results) == len(jobs)


def test_one_huge_text_leaves_the_loop_and_fails_alone(tokenizer: Any) -> None:
    huge = "word " * (stages.ON_LOOP_CHARS // 4)  # over the model's 256 tokens, and over the char bound
    jobs = [TokenizeJob([SENTENCE]), TokenizeJob([huge]), TokenizeJob([SENTENCE])]
    results, thread = _run_and_note_thread(tokenizer, "encode", jobs)
    assert thread.startswith("tokenize")
    assert isinstance(results[0], EncodedTexts) and isinstance(results[2], EncodedTexts)
    assert isinstance(results[1], InputTooLongError)


def _outputs(rows: int, n: int) -> list[ModelOutput | ServiceError]:
    rng = np.random.default_rng(0)
    identity = ModelIdentity(name="m", version="1")
    values = [rng.random((rows, 384), dtype=np.float32) for _ in range(n)]
    return [ModelOutput(model=identity, task="embed", values=v, token_count=rows * 9) for v in values]


def test_serializer_runs_small_groups_on_the_loop_and_large_on_its_threads(serializer: Any) -> None:
    options = ResponseOptions(route="embeddings", media_type="application/json")
    small = _outputs(1, 8)
    large = _outputs(32, 4)  # 4 x 32 x 384 floats: over ON_LOOP_VALUES
    assert sum(o.values.size for o in large if isinstance(o, ModelOutput)) > stages.ON_LOOP_VALUES
    small_out, small_thread = _run_and_note_thread(serializer, "serialize", small, [options] * 8, 6)
    large_out, large_thread = _run_and_note_thread(serializer, "serialize", large, [options] * 4, 6)
    assert small_thread == threading.main_thread().name
    assert large_thread.startswith("serialize")
    assert len(small_out) == 8 and len(large_out) == 4
    again, _ = _run_and_note_thread(serializer, "serialize", large[:1], [options], 6)
    assert large_out[0].body == again[0].body  # same bytes whichever thread made them


def test_serializer_passes_errors_through_in_their_slots(serializer: Any) -> None:
    options = ResponseOptions(route="embeddings", media_type="application/json")
    error = InputTooLongError("too long", "input")
    outputs: list[ModelOutput | ServiceError] = [*_outputs(1, 1), error, *_outputs(1, 1)]
    results, _ = _run_and_note_thread(serializer, "serialize", outputs, [options] * 3, 6)
    assert results[1] is error
    assert all(not isinstance(r, ServiceError) for r in (results[0], results[2]))

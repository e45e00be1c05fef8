"""The tokenizer and serializer deployments' classes, called directly (no Ray): one request per call;
small requests run on the event loop, large ones on the stage's own threads, with the same answers
either way; a request's error is its own answer, and an error handed to the serializer passes through."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from deployments.config import ObservabilityConfig
from deployments.pipeline import stages
from deployments.repository.manifest import ResolvedModel
from postprocess.contracts import ModelIdentity, ModelOutput, ResponseOptions, SerializedResponse
from preprocess.contracts import EncodedTexts, TokenizeJob
from preprocess.errors import InputTooLongError, InternalError

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "


def _run_and_note_thread(obj: Any, method: str, *args: Any) -> tuple[Any, str | None]:
    """Calls the async stage method on a fresh loop; returns its result and the thread the work ran on
    (None when the method answered without doing the work, as for an error passed through)."""
    seen: list[str] = []
    work = getattr(obj, f"_{method}")

    def noting(*a: Any) -> Any:
        seen.append(threading.current_thread().name)
        return work(*a)

    setattr(obj, f"_{method}", noting)
    try:
        result = asyncio.run(getattr(obj, method)(*args))
    finally:
        delattr(obj, f"_{method}")
    assert len(seen) <= 1  # one request, one piece of work
    return result, seen[0] if seen else None


@pytest.fixture(scope="module")
def tokenizer(default_model: ResolvedModel) -> Any:
    return stages.TokenizerDeployment.func_or_class(default_model, ObservabilityConfig())


@pytest.fixture(scope="module")
def serializer() -> Any:
    return stages.SerializerDeployment.func_or_class(ObservabilityConfig())


def test_a_small_request_is_tokenized_on_the_event_loop(tokenizer: Any) -> None:
    result, thread = _run_and_note_thread(tokenizer, "encode", TokenizeJob([SENTENCE] * 8))
    assert thread == threading.main_thread().name  # asyncio.run's loop runs on this thread
    assert isinstance(result, EncodedTexts) and len(result) == 8


def test_a_large_request_is_tokenized_on_the_stage_threads_with_the_same_answers(tokenizer: Any) -> None:
    texts = [SENTENCE * 4] * 80  # over INLINE_CHARS in all, though each text is small
    assert sum(map(len, texts)) > stages.INLINE_CHARS
    large, thread = _run_and_note_thread(tokenizer, "encode", TokenizeJob(texts))
    assert thread is not None and thread.startswith("tokenize")
    small, small_thread = _run_and_note_thread(tokenizer, "encode", TokenizeJob(texts[:8]))
    assert small_thread == threading.main_thread().name
    assert isinstance(large, EncodedTexts) and isinstance(small, EncodedTexts)
    assert len(large) == 80 and len(small) == 8
    np.testing.assert_array_equal(large.ids[: small.offsets[-1]], small.ids)  # same tokens on either thread
    np.testing.assert_array_equal(large.offsets[:9], small.offsets)


def test_one_huge_text_leaves_the_loop_and_fails_alone(tokenizer: Any) -> None:
    """A request too long for the model answers with its own error, off the loop; the stage still
    serves the next request (one per call: nothing else shares its fate)."""
    huge = "word " * (stages.INLINE_CHARS // 4)  # over the model's 256 tokens, and over the char bound
    result, thread = _run_and_note_thread(tokenizer, "encode", TokenizeJob([huge]))
    assert thread is not None and thread.startswith("tokenize")
    assert isinstance(result, InputTooLongError)
    after, _ = _run_and_note_thread(tokenizer, "encode", TokenizeJob([SENTENCE]))
    assert isinstance(after, EncodedTexts) and len(after) == 1


def test_a_failing_tokenizer_answers_that_request_with_an_internal_error(tokenizer: Any, monkeypatch) -> None:
    """A bug on one request's input becomes that request's 500, not an exception out of the stage."""

    def broken(texts: list[str], truncate: bool) -> EncodedTexts:
        raise RuntimeError("bug")

    monkeypatch.setattr(tokenizer._tokenizer, "encode", broken)
    result, _ = _run_and_note_thread(tokenizer, "encode", TokenizeJob([SENTENCE], request_id="r1"))
    assert isinstance(result, InternalError)


def _output(rows: int, seed: int = 0) -> ModelOutput:
    rng = np.random.default_rng(seed)
    identity = ModelIdentity(name="m", version="1")
    values = rng.random((rows, 384), dtype=np.float32)
    return ModelOutput(model=identity, task="embed", values=values, token_count=rows * 9)


def test_serializer_runs_small_requests_on_the_loop_and_large_on_its_threads(serializer: Any) -> None:
    options = ResponseOptions(route="embeddings", media_type="application/json")
    small = _output(8)
    large = _output(128)  # 128 x 384 floats: over INLINE_VALUES
    assert small.values.size <= stages.INLINE_VALUES < large.values.size
    small_out, small_thread = _run_and_note_thread(serializer, "serialize", small, options)
    large_out, large_thread = _run_and_note_thread(serializer, "serialize", large, options)
    assert small_thread == threading.main_thread().name
    assert large_thread is not None and large_thread.startswith("serialize")
    assert isinstance(small_out, SerializedResponse) and isinstance(large_out, SerializedResponse)
    inline = serializer._serialize(large, options)  # the same work on this thread
    assert large_out.body == inline.body  # same bytes whichever thread made them


def test_serializer_passes_an_incoming_error_through_untouched(serializer: Any) -> None:
    options = ResponseOptions(route="embeddings", media_type="application/json")
    error = InputTooLongError("too long", "input")
    result, thread = _run_and_note_thread(serializer, "serialize", error, options)
    assert result is error  # the very object, unchanged
    assert thread is None  # never serialized, on no thread
    ok, _ = _run_and_note_thread(serializer, "serialize", _output(1), options)
    assert isinstance(ok, SerializedResponse)  # the next request is unaffected


def test_a_failing_serialization_answers_that_request_with_an_internal_error(
    serializer: Any, monkeypatch
) -> None:
    def broken(*args: Any) -> SerializedResponse:
        raise RuntimeError("bug")

    monkeypatch.setattr(stages, "serialize", broken)
    options = ResponseOptions(route="embeddings", media_type="application/json")
    result, _ = _run_and_note_thread(serializer, "serialize", _output(1), options)
    assert isinstance(result, InternalError)

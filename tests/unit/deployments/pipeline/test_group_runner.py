"""A failing batch fails only what it must: every request gets a result or its own error."""

from __future__ import annotations

import numpy as np

from contracts.errors import InputTooLongError, ModelExecutionError, UnavailableError
from contracts.outputs import ModelIdentity, ModelOutput, SparseRows
from contracts.tokenized import EncodedTexts
from deployments.ingress.errors import status_of
from deployments.pipeline.group_runner import OutputMaker, run_groups
from deployments.runtime.batching import BatchLimits
from deployments.runtime.runner_base import BatchRunner

POISON = 666


class PoisonRunner(BatchRunner):
    """Embeds a sequence as [its first token id, ...]; any batch holding the poison token raises."""

    backend = "fake"

    def __init__(self, model) -> None:
        super().__init__(model, pad_id=0)
        self.batches = 0

    @property
    def device_name(self) -> str:
        return "fake"

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.batches += 1
        if (ids == POISON).any():
            raise IndexError("index out of range in self")  # what a bad token id gives on CPU torch
        return np.repeat(ids[:, :1].astype(np.float32), self.output_size, axis=1)


def _request(*first_ids: int) -> EncodedTexts:
    ids = np.array([t for first in first_ids for t in (first, 7, 8)], dtype=np.int32)
    return EncodedTexts(ids=ids, offsets=np.arange(0, 3 * len(first_ids) + 1, 3, dtype=np.int64))


def _make(encoded: EncodedTexts, values: np.ndarray) -> ModelOutput:
    return ModelOutput(ModelIdentity("m", "1"), "embed", values, encoded.token_count)


LIMITS = BatchLimits(64, 100_000)


def test_clean_groups_get_their_own_rows(default_model):
    runner = PoisonRunner(default_model)
    run = run_groups(runner, [[_request(11, 12)], [_request(13)]], LIMITS, _make)
    assert [[a.values[:, 0].tolist() for a in g] for g in run.answers] == [[[11.0, 12.0]], [[13.0]]]
    assert run.isolated_failures == 0 and run.sequences == 3


def test_poisoned_request_fails_alone(default_model):
    runner = PoisonRunner(default_model)
    upstream = InputTooLongError("too long", "input")
    groups = [[_request(21), _request(POISON, 22)], [upstream, _request(23, 24)]]
    run = run_groups(runner, groups, LIMITS, _make)
    (ok1, bad), (passed_on, ok2) = run.answers
    assert ok1.values[:, 0].tolist() == [21.0]
    assert isinstance(bad, ModelExecutionError) and bad.code == "model_error"
    assert passed_on is upstream  # an upstream error is answered as it was
    assert ok2.values[:, 0].tolist() == [23.0, 24.0]
    assert run.isolated_failures == 1


def test_a_dead_device_is_not_retried_request_by_request(default_model):
    runner = PoisonRunner(default_model)
    runner.injected_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    groups = [[_request(41), _request(42)], [_request(43)]]
    run = run_groups(runner, groups, LIMITS, _make)
    answers = [a for g in run.answers for a in g]
    assert runner.fatal_error is not None
    assert all(isinstance(a, UnavailableError) and status_of(a) == 503 for a in answers), answers
    assert runner.batches == 0  # the injected error fired instead of the forward pass; nothing ran after it
    assert run.isolated_failures == 3


def test_lone_failing_request_gets_an_error_not_an_exception(default_model):
    run = run_groups(PoisonRunner(default_model), [[_request(POISON)]], LIMITS, _make)
    assert isinstance(run.answers[0][0], ModelExecutionError)


def test_groups_of_only_errors_run_nothing(default_model):
    runner = PoisonRunner(default_model)
    err = InputTooLongError("x")
    run = run_groups(runner, [[err], [err]], LIMITS, _make)
    assert run.answers == [[err], [err]] and runner.batches == 0


def test_expired_requests_are_dropped_before_the_model(default_model):
    import dataclasses

    from contracts.errors import DeadlineExceededError

    runner = PoisonRunner(default_model)
    expired = dataclasses.replace(_request(POISON), deadline=1.0)  # long past: never reaches the model
    fresh = dataclasses.replace(_request(31), deadline=4e9)
    run = run_groups(runner, [[expired, fresh]], LIMITS, _make)
    dropped, answered = run.answers[0]
    assert isinstance(dropped, DeadlineExceededError) and dropped.code == "deadline_exceeded"
    assert answered.values[:, 0].tolist() == [31.0]
    assert runner.batches == 1 and run.isolated_failures == 0


def test_a_sparse_model_answers_in_sparse_rows():
    make = OutputMaker(ModelIdentity("splade", "1"), "sparse_embed", ())
    dense = np.zeros((2, 1000), np.float32)
    dense[0, [3, 500]] = [0.5, 2.0]
    output = make(_request(1, 2), dense)
    assert isinstance(output.values, SparseRows) and output.values.size == 2
    np.testing.assert_array_equal(output.values.dense(), dense)
    embed = OutputMaker(ModelIdentity("m", "1"), "embed", ())(_request(1, 2), dense)
    assert isinstance(embed.values, np.ndarray)  # dense models keep their rows as they are

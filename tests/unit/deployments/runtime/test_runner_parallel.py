"""Parallel passes: a batch cut into at least N length-sorted passes, run on N threads, same answers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from deployments.runtime.batching import BatchLimits
from deployments.runtime.runner_base import BatchRunner

LIMITS = BatchLimits(64, 100_000)


class RecordingRunner(BatchRunner):
    """Embeds a sequence as [its length, its first id, ...]; records each pass's thread and size."""

    backend = "fake"

    def __init__(self, model, fail_on: int | None = None) -> None:
        super().__init__(model, pad_id=0)
        self.passes: list[tuple[str, int]] = []
        self.longest: list[int] = []  # each pass's padded length, in the order the passes started
        self.fail_on = fail_on
        self._lock = threading.Lock()

    @property
    def device_name(self) -> str:
        return "fake"

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self._lock:
            self.passes.append((threading.current_thread().name, len(ids)))
            self.longest.append(ids.shape[1])
        time.sleep(0.01)  # long enough for the passes to overlap when they can
        if self.fail_on is not None and (ids == self.fail_on).any():
            raise IndexError("index out of range in self")
        out = np.zeros((len(ids), self.output_size), dtype=np.float32)
        out[:, 0] = mask.sum(1)
        out[:, 1] = ids[:, 0]
        return out


def _sequences(lengths: list[int]) -> list[np.ndarray]:
    return [np.arange(100 + i, 100 + i + n, dtype=np.int32) for i, n in enumerate(lengths)]


def test_default_is_one_pass_on_the_calling_thread(default_model):
    runner = RecordingRunner(default_model)
    runner.run(_sequences([5, 9, 7, 3]), LIMITS)
    assert runner.passes == [(threading.current_thread().name, 4)]


def test_two_passes_give_the_same_rows_in_input_order(default_model):
    lengths = [5, 40, 7, 3, 22, 9, 31]
    serial, parallel = RecordingRunner(default_model), RecordingRunner(default_model)
    parallel.set_parallel(2)
    expected = serial.run(_sequences(lengths), LIMITS).values
    got = parallel.run(_sequences(lengths), LIMITS)
    np.testing.assert_array_equal(got.values, expected)
    assert got.values[:, 0].tolist() == lengths  # row i is input i
    assert got.micro_batches >= 2 and sum(n for _, n in parallel.passes) == len(lengths)
    threads = {name for name, _ in parallel.passes}
    assert len(threads) == 2 and all(name.startswith("pass") for name in threads)
    assert got.padded_tokens < max(lengths) * len(lengths)  # sorted passes pad less than one pass would


def test_small_batches_are_split_so_both_threads_work(default_model):
    runner = RecordingRunner(default_model)
    runner.set_parallel(2)
    runner.run(_sequences([8, 9, 10, 11]), LIMITS)  # fits one 4-sequence pass; cut into two of 2
    assert sorted(n for _, n in runner.passes) == [2, 2]
    runner.passes.clear()
    runner.run(_sequences([8]), LIMITS)  # one sequence: one pass, no thread hop
    assert runner.passes == [(threading.current_thread().name, 1)]


def test_a_failing_pass_raises_to_the_caller(default_model):
    runner = RecordingRunner(default_model, fail_on=103)
    runner.set_parallel(2)
    with pytest.raises(IndexError):
        runner.run(_sequences([5, 6, 7, 8]), LIMITS)  # sequence 3 starts with id 103
    runner.fail_on = None
    assert runner.run(_sequences([5, 6]), LIMITS).values.shape == (2, runner.output_size)  # still usable


def test_the_longest_passes_start_first(default_model):
    # Ascending order would leave the longest pass to start last while the other thread idles.
    runner = RecordingRunner(default_model)
    runner.set_parallel(2)
    runner.run(_sequences([3, 61, 5, 30, 4, 60, 6, 31]), BatchLimits(2, 100_000))
    assert len(runner.longest) == 4  # [3, 4] [5, 6] [30, 31] [60, 61]
    assert set(runner.longest[:2]) == {61, 31}
    assert runner.longest[2:] == [6, 4]

"""Out-of-memory back-off, with the failure injected on CPU: split, retry the halves, lower the cap."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.runtime.batching import BatchLimits
from deployments.runtime.runner_base import BatchRunner


class FlakyRunner(BatchRunner):
    """Returns each sequence's length as its 'embedding'; raises a CUDA-style OOM above a size."""

    backend = "fake"

    def __init__(self, model, fits: int) -> None:
        super().__init__(model, pad_id=0)
        self.fits = fits
        self.calls: list[int] = []
        self.released = 0

    @property
    def device_name(self) -> str:
        return "fake"

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.calls.append(len(ids))
        if len(ids) > self.fits:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return np.repeat(mask.sum(1, keepdims=True).astype(np.float32), self.output_size, axis=1)

    def _release_memory(self) -> None:
        self.released += 1


def _seqs(n: int) -> list[np.ndarray]:
    return [np.ones(i + 1, dtype=np.int32) for i in range(n)]


def test_oom_splits_retries_and_answers_every_row(default_model):
    runner = FlakyRunner(default_model, fits=5)
    result = runner.run(_seqs(32), BatchLimits(32, 100_000))
    np.testing.assert_array_equal(result.values[:, 0], np.arange(1, 33))  # every row, in order
    assert runner.calls[0] == 32 and max(runner.calls[1:]) <= 16
    assert runner.cap.current <= 5  # lowered to what fits
    assert runner.released >= 1


def test_next_batches_start_at_the_lowered_cap_and_climb_back(default_model):
    runner = FlakyRunner(default_model, fits=8)
    runner.cap.recovery_batches = 3
    runner.run(_seqs(32), BatchLimits(32, 100_000))
    lowered = runner.cap.current
    runner.calls.clear()
    runner.run(_seqs(8), BatchLimits(32, 100_000))
    assert max(runner.calls) <= lowered  # no new OOM: the plan already uses the lower cap
    runner.fits = 1000  # memory pressure gone
    for _ in range(40):
        runner.run(_seqs(32), BatchLimits(32, 100_000))
    assert runner.cap.current == 32


def test_single_sequence_oom_is_raised_not_looped(default_model):
    runner = FlakyRunner(default_model, fits=0)
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.run(_seqs(4), BatchLimits(32, 100_000))


def test_other_errors_are_not_retried(default_model):
    class Broken(FlakyRunner):
        def _forward(self, ids, mask):
            self.calls.append(len(ids))
            raise ValueError("model bug")

    runner = Broken(default_model, fits=100)
    with pytest.raises(ValueError):
        runner.run(_seqs(8), BatchLimits(32, 100_000))
    assert runner.calls == [8] and runner.cap.current == 32


def test_unrecoverable_device_error_marks_the_runner_fatal(default_model):
    class Wrecked(FlakyRunner):
        def _forward(self, ids, mask):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    runner = Wrecked(default_model, fits=100)
    assert runner.fatal_error is None
    with pytest.raises(RuntimeError):
        runner.run(_seqs(2), BatchLimits(32, 100_000))
    assert "illegal memory access" in (runner.fatal_error or "")


def test_oom_alone_is_not_fatal(default_model):
    runner = FlakyRunner(default_model, fits=4)
    runner.run(_seqs(16), BatchLimits(32, 100_000))
    assert runner.fatal_error is None


def test_an_injected_device_error_takes_the_real_path_once(default_model):
    runner = FlakyRunner(default_model, fits=100)
    runner.injected_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        runner.run(_seqs(2), BatchLimits(32, 100_000))
    assert "illegal memory access" in (runner.fatal_error or "")
    assert runner.injected_error is None
    assert runner.run(_seqs(2), BatchLimits(32, 100_000)).values.shape[0] == 2  # raised once, not forever

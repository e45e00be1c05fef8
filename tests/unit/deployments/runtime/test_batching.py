"""Batching policy: token budgets, length-sorted plans, the adaptive window, the batch cap."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import InputTooLongError
from contracts.tokenized import EncodedTexts
from deployments.pipeline.batch_queue import QueuedGroup, ReplicaLimits, batch_size
from deployments.runtime.batching import (
    AdaptiveBatchCap,
    AdaptiveWaitWindow,
    BatchLimits,
    is_out_of_memory,
    padding_efficiency,
    plan_micro_batches,
)


def _encoded(*lengths: int) -> EncodedTexts:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return EncodedTexts(ids=np.ones(int(offsets[-1]), dtype=np.int32), offsets=offsets)


@pytest.mark.parametrize(
    ("sequences", "longest", "expected"),
    [(1, 10, 1), (32, 10, 32), (16, 64, 16), (16, 512, 32), (4, 4096, 64), (33, 1, 33)],
)
def test_size_counts_both_limits(sequences, longest, expected):
    assert BatchLimits(max_sequences=32, max_tokens=8192).size_of(sequences, longest) == expected


def test_plan_respects_count_and_token_budget_and_keeps_everything():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 257, size=300)
    limits = BatchLimits(max_sequences=16, max_tokens=1024)
    plan = plan_micro_batches(lengths, limits)
    covered = np.sort(np.concatenate(plan))
    np.testing.assert_array_equal(covered, np.arange(300))  # every item exactly once
    for idx in plan:
        assert len(idx) <= 16
        assert len(idx) == 1 or len(idx) * lengths[idx].max() <= 1024
        assert (np.diff(lengths[idx]) >= 0).all()  # sorted: similar lengths together


def test_item_over_budget_runs_alone():
    lengths = np.array([5, 600, 7, 6])
    plan = plan_micro_batches(lengths, BatchLimits(max_sequences=32, max_tokens=512))
    assert [list(p) for p in plan] == [[0, 3, 2], [1]]


def test_sorting_cuts_padding():
    lengths = np.array([10, 250, 12, 240, 11, 245, 9, 251])
    sorted_plan = plan_micro_batches(lengths, BatchLimits(max_sequences=4, max_tokens=10_000))
    arrival_plan = [np.arange(0, 4), np.arange(4, 8)]
    assert padding_efficiency(lengths, sorted_plan) > 0.95
    assert padding_efficiency(lengths, arrival_plan) < 0.55


def _queued(*groups: list) -> list[QueuedGroup]:
    return [QueuedGroup(list(g), arrived_s=0.0, arrived_ns=0) for g in groups]


def test_batch_size_fn_bounds_requests_and_never_refuses_a_lone_item():
    ReplicaLimits.limits = BatchLimits(max_sequences=8, max_tokens=256)
    try:
        # Items are groups of requests (one ingress call each); failed members count for nothing.
        assert batch_size(_queued([_encoded(3, 4)])) == 2
        assert batch_size(_queued([_encoded(3), _encoded(100)], [_encoded(4)])) == 10  # 3 x 100 > 256
        assert batch_size(_queued([_encoded(*([5] * 20))])) == 8  # a big group alone: clipped, so it runs
        assert batch_size(_queued([_encoded(300)])) == 8  # one sequence over the token budget: runs alone
        assert batch_size(_queued([InputTooLongError("too long")])) == 1  # nothing to run, still leaves
    finally:
        ReplicaLimits.limits = BatchLimits(32, 8192)


def test_wait_window_shrinks_at_low_fill_and_grows_at_cap_within_bounds():
    window = AdaptiveWaitWindow(current_s=0.005, min_s=0.001, max_s=0.02)
    for _ in range(50):
        window.observe(batch_size=1, cap=32)
    assert window.current_s == pytest.approx(0.001)
    for _ in range(50):
        window.observe(batch_size=32, cap=32)
    assert window.current_s == pytest.approx(0.02)


def test_wait_window_holds_in_between():
    window = AdaptiveWaitWindow(current_s=0.005, min_s=0.001, max_s=0.02)
    for _ in range(50):
        window.observe(batch_size=16, cap=32)
    assert window.current_s == pytest.approx(0.005)


def test_wait_window_clamps_initial_value():
    assert AdaptiveWaitWindow(current_s=0.5, min_s=0.001, max_s=0.02).current_s == 0.02


def test_cap_halves_on_oom_and_climbs_back_slowly():
    cap = AdaptiveBatchCap(ceiling=32, recovery_batches=10)
    assert cap.on_oom(failed_size=32) == 16
    assert cap.on_oom(failed_size=16) == 8
    for _ in range(9):
        assert cap.on_success() == 8  # not yet: needs a run of clean batches
    assert cap.on_success() == 10
    for _ in range(200):
        cap.on_success()
    assert cap.current == 32  # never above the ceiling


def test_cap_never_below_one():
    cap = AdaptiveBatchCap(ceiling=2)
    cap.on_oom(2)
    assert cap.on_oom(1) == 1


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (type("OutOfMemoryError", (RuntimeError,), {})("x"), True),
        (RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory"), True),
        (ValueError("bad shape"), False),
    ],
)
def test_is_out_of_memory(exc, expected):
    assert is_out_of_memory(exc) is expected


def test_cap_follows_a_new_ceiling_unless_backed_off():
    cap = AdaptiveBatchCap(ceiling=8)
    cap.set_ceiling(32)
    assert cap.current == 32
    cap.on_oom(32)
    cap.set_ceiling(64)
    assert cap.current == 16  # memory pressure still holds it down
    cap.set_ceiling(4)
    assert cap.current == 4


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("CUDA error: device-side assert triggered", True),
        ("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm", True),
        ("CUDA out of memory. Tried to allocate 20.00 MiB", False),  # recoverable: split and retry
        ("index out of range in self", False),
    ],
)
def test_unrecoverable_device_errors(message, expected):
    from deployments.runtime.batching import is_unrecoverable_device_error

    assert is_unrecoverable_device_error(RuntimeError(message)) is expected

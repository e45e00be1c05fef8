"""The lone pass on the copy's torch graph (deployments/runtime/lone_torch.py): only for the lengths where it
was faster at load, only with a short libgomp spin count, with the copy's own answers, its worker pinned."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from deployments.repository.manifest import ResolvedModel
from deployments.runtime import lone_torch
from deployments.runtime.lone_pass import LonePass
from deployments.runtime.lone_torch import SharedForward, pinned_forward, torch_from, torch_lone_pass
from deployments.runtime.runner_base import BatchRunner


def test_torch_takes_the_lengths_from_the_shortest_at_which_it_wins_at_every_longer_one() -> None:
    measured = {16: (5.5, 6.4), 48: (9.4, 8.0), 96: (14.1, 8.6), 160: (21.5, 13.0)}  # a replica's log
    assert torch_from(measured) == 48
    assert torch_from({16: (5.0, 4.0), 48: (9.0, 10.0), 96: (14.0, 9.0)}) == 96  # not 16: lost at 48
    assert torch_from({16: (5.0, 4.0), 160: (10.0, 11.0)}) is None  # slower at the longest: never
    assert torch_from({16: (5.0, 5.0), 48: (9.0, 8.0)}) == 48  # a tie is not a win
    assert torch_from({16: (5.0, 4.0), 48: (9.0, 8.0)}) == 16


def _two_cpus() -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("pinning two threads needs two CPUs")
    return allowed[:2]


def _texts(copy: BatchRunner, lengths: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(copy.pad_id + 1, 900, size=n, dtype=np.int32) for n in lengths]


def test_the_shared_forward_gives_the_copys_answers_in_one_pass_on_its_own_thread(copy: BatchRunner) -> None:
    shared = SharedForward(copy)
    texts = _texts(copy, (3, 40, 17, 64))
    assert copy.parallel == 2 and shared.parallel == 1  # the copy would split the batch over its threads
    got = shared.run(texts)
    np.testing.assert_allclose(got.values, copy.run(texts).values, atol=1e-2)
    assert got.micro_batches == 1 and shared.backend == "torch" and shared.device_name == copy.device_name


def _affinity(tid: int) -> set[int]:
    return os.sched_getaffinity(tid)


def test_the_pinned_pool_pins_its_one_worker_and_leaves_later_threads_on_one(copy: BatchRunner) -> None:
    caller_cpu, worker_cpu = _two_cpus()
    before = {int(t) for t in os.listdir("/proc/self/task")}
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lone-pass")
    executor.submit(os.sched_setaffinity, 0, {caller_cpu}).result()
    try:
        shared = pinned_forward(copy, executor, worker_cpu)
        assert isinstance(shared, SharedForward)
        assert executor.submit(torch.get_num_threads).result() == 2
        new = {int(t) for t in os.listdir("/proc/self/task")} - before
        pinned = [t for t in new if _affinity(t) == {worker_cpu}]
        assert len(pinned) == 1  # libgomp's one worker; the executor's own thread is on the caller's CPU
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [1]  # the copy's threads that start later keep one thread
    finally:
        executor.shutdown()


def test_without_a_short_spin_count_lone_passes_stay_on_onnx_runtime(
    copy: BatchRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        for spins in (None, "300000", "many"):
            if spins is None:
                monkeypatch.delenv(lone_torch.SPIN_ENV, raising=False)
            else:
                monkeypatch.setenv(lone_torch.SPIN_ENV, spins)
            with caplog.at_level("INFO", logger="textserve.runner"):
                assert torch_lone_pass(copy, 1, copy, executor, 1, 128) is None
            assert "GOMP_SPINCOUNT" in caplog.text
        monkeypatch.setenv(lone_torch.SPIN_ENV, "10000")
        assert torch_lone_pass(copy, None, copy, executor, 1, 128) is None  # the copy on the default threads
    finally:
        executor.shutdown()


def test_the_lone_pass_runs_the_lengths_measured_faster_on_torch(
    served: ResolvedModel, copy: BatchRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lone_torch.SPIN_ENV, "10000")
    measured: list[list[int]] = []

    def timings(onnx: BatchRunner, torch_pass: BatchRunner, lengths: list[int], *_: object) -> dict:
        measured.append(list(lengths))
        assert isinstance(torch_pass, SharedForward) and onnx.backend == "onnx"
        return {16: (5.5, 6.4), 48: (9.4, 8.0), 128: (14.1, 8.6)}

    monkeypatch.setattr(lone_torch, "time_both", timings)
    two = set(_two_cpus())
    lone = LonePass.for_copy(served, copy, hash_files=False, allowed=two)
    assert lone is not None and isinstance(lone.torch, SharedForward)
    max_tokens = served.manifest.input.max_tokens
    assert measured == [sorted({min(n, max_tokens) for n in lone_torch.CALIBRATION_LENGTHS})]
    assert lone.torch_from == 48
    assert lone.runner_for(47) is lone.runner and lone.runner_for(48) is lone.torch
    assert lone.runner_for(max_tokens) is lone.torch
    off = LonePass.for_copy(served, copy, hash_files=False, allowed=two, torch_lengths=False)
    assert off is not None and off.torch is None and off.runner_for(max_tokens) is off.runner
    monkeypatch.setattr(lone_torch, "time_both", lambda *_: {16: (5.0, 6.0), 128: (9.0, 9.5)})
    slower = LonePass.for_copy(served, copy, hash_files=False, allowed=two)
    assert slower is not None and slower.torch is None
    for made in (lone, off, slower):
        made.executor.shutdown()

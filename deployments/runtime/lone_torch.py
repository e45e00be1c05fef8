"""The lone pass on the copy's own torch graph, two OpenMP threads pinned, for the lengths where it is faster.

Where the CPU computes bf16 in matrix units (AMX), the copy's traced bf16 graph on two pinned threads runs a
long text in about half the time of ONNX Runtime's fp32 export on the same two CPUs. Measured in process on
an Intel Xeon with AMX, 2 vCPUs, 50 ms idle before each pass (docs/architecture.md, "The lone pass on torch"):
158 tokens 10.3 ms against 17.6, 128 tokens 8.2 against 14.6, but 12 tokens 5.3 against 4.2, at less CPU
per pass (14.2 against 20.4 ms). Which one wins where depends on the CPU, so each replica measures both on
its own lone-pass thread at load and takes torch only from the shortest length at which it was faster at
every longer length measured (``torch_from``). No Ray.

libgomp's worker spins after each pass for ``GOMP_SPINCOUNT`` rounds (300000 by default: milliseconds of a
core the other replicas need) before it sleeps; with 10000 (serve_config.yaml) it spins between the
operators of a pass and sleeps soon after. Without a short spin count set, the torch lone pass stays off.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from deployments.runtime.openmp import on_passing_thread
from deployments.runtime.runner_base import BatchRunner

log = logging.getLogger("textserve.runner")

SPIN_ENV = "GOMP_SPINCOUNT"
MAX_SPIN = 100_000  # libgomp's default (300000) burns milliseconds of the other core after every pass
CALIBRATION_LENGTHS = (16, 48, 96, 160)  # tokens, capped at the model's limit
CALIBRATION_REPS = 7
CALIBRATION_PAUSE_S = 0.02  # idle before each timed pass: real arrivals find the threads asleep


class SharedForward(BatchRunner):
    """The copy's forward pass, run from another thread as its own runner: one pass per batch on the calling
    thread (the copy may split a batch across its pass threads), the same weights and graph."""

    backend = "torch"

    def __init__(self, copy: BatchRunner) -> None:
        super().__init__(copy.model_info, copy.pad_id)
        self.graph = copy.graph
        self._copy = copy

    @property
    def device_name(self) -> str:
        return self._copy.device_name

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._copy._forward(ids, mask)


def spin_count() -> int | None:
    """libgomp's spin count as this process set it, or None when unset or unreadable."""
    try:
        return int(os.environ[SPIN_ENV])
    except (KeyError, ValueError):
        return None


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def start_pinned_pool(runner: BatchRunner, worker_cpu: int) -> bool:
    """On the lone pass's (pinned) thread: its OpenMP pool of two threads, made by a first pass, with the one
    worker libgomp starts pinned to ``worker_cpu``. False, pinning nothing, unless exactly one thread appeared
    (another thread starting meanwhile could not be told apart)."""
    before = _threads()
    # This thread's OpenMP threads; also torch's default for threads that start later (reset by the caller).
    torch.set_num_threads(2)
    ids = np.full(64, runner.pad_id + 1, dtype=np.int32)
    runner.run([ids])
    new = _threads() - before
    if len(new) != 1:
        return False
    os.sched_setaffinity(new.pop(), {worker_cpu})
    return True


def pinned_forward(copy: BatchRunner, executor: ThreadPoolExecutor, worker_cpu: int) -> SharedForward | None:
    """The copy's forward on ``executor``'s one (pinned) thread with two OpenMP threads, libgomp's worker
    pinned to ``worker_cpu`` (``start_pinned_pool``); None where that worker could not be told apart. Threads
    that start torch later (the copy's own) keep one thread, as a copy of ``intra_op_threads`` 1 runs."""
    shared = SharedForward(copy)
    pinned = executor.submit(start_pinned_pool, shared, worker_cpu).result()
    on_passing_thread(lambda: torch.set_num_threads(1), name="torch-threads")
    return shared if pinned else None


def torch_from(timings: dict[int, tuple[float, float]]) -> int | None:
    """From ``{length: (onnx seconds, torch seconds)}``: the shortest length from which torch was faster at
    every longer length too, or None where it was not faster at the longest."""
    start = None
    for length in sorted(timings, reverse=True):
        onnx, torch_s = timings[length]
        if torch_s >= onnx:
            break
        start = length
    return start


def time_both(
    onnx: BatchRunner, torch_pass: BatchRunner, lengths: Sequence[int], reps: int, pause_s: float
) -> dict[int, tuple[float, float]]:
    """Median seconds of one text of each length on either runner, on the calling thread, alternated."""
    timings = {}
    for length in lengths:
        ids = np.full(length, onnx.pad_id + 1, dtype=np.int32)
        seen: dict[str, list[float]] = {"onnx": [], "torch": []}
        for _ in range(reps):
            for name, runner in (("onnx", onnx), ("torch", torch_pass)):
                time.sleep(pause_s)
                start = time.perf_counter()
                runner.run([ids])
                seen[name].append(time.perf_counter() - start)
        timings[length] = (statistics.median(seen["onnx"]), statistics.median(seen["torch"]))
    return timings


def torch_lone_pass(
    copy: BatchRunner,
    copy_threads: int | None,
    onnx: BatchRunner,
    executor: ThreadPoolExecutor,
    worker_cpu: int,
    max_tokens: int,
) -> tuple[BatchRunner, int] | None:
    """The copy's forward on the lone pass's thread (``executor``, already pinned) with two pinned OpenMP
    threads, and the length from which it runs groups instead of ``onnx``; None (logged) where it is slower
    at every length, libgomp would spin long, or its worker could not be pinned. Only for a torch copy on
    one thread (``copy_threads``), whose threads must keep that one."""
    if copy.backend != "torch" or copy_threads != 1:
        log.info("lone passes on ONNX Runtime only: the copy is %s on %s threads", copy.backend, copy_threads)
        return None
    spins = spin_count()
    if spins is None or spins > MAX_SPIN:
        log.info("lone passes on ONNX Runtime only: set %s at most %d (now %s)", SPIN_ENV, MAX_SPIN, spins)
        return None
    shared = pinned_forward(copy, executor, worker_cpu)
    if shared is None:
        log.warning("lone passes on ONNX Runtime only: could not tell libgomp's worker thread apart")
        return None
    lengths = sorted({min(n, max_tokens) for n in CALIBRATION_LENGTHS})
    timings = executor.submit(
        time_both, onnx, shared, lengths, CALIBRATION_REPS, CALIBRATION_PAUSE_S
    ).result()
    start = torch_from(timings)
    measured = ", ".join(f"{n}: {1e3 * o:.1f}/{1e3 * t:.1f}" for n, (o, t) in timings.items())
    log.info("lone pass, tokens: ONNX Runtime/torch ms: %s; torch from %s tokens", measured, start)
    return None if start is None else (shared, start)


__all__ = [
    "SharedForward",
    "pinned_forward",
    "start_pinned_pool",
    "time_both",
    "torch_from",
    "torch_lone_pass",
]

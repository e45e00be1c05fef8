"""Backend-independent model running: length-sorted token-budget micro-batches, padding, and
out-of-memory back-off (split the batch, retry the halves, lower the cap). No Ray."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from deployments.repository.manifest import ResolvedModel
from deployments.runtime.batching import (
    AdaptiveBatchCap,
    BatchLimits,
    is_out_of_memory,
    is_unrecoverable_device_error,
    padding_efficiency,
    plan_micro_batches,
)
from deployments.user_config import BatchingConfig

log = logging.getLogger("textserve.runner")

# Per forward pass, when the caller gives none: Inference's own defaults (one source for both).
_BATCHING = BatchingConfig()
DEFAULT_LIMITS = BatchLimits(_BATCHING.micro_batch_size, _BATCHING.micro_batch_tokens)


@dataclass(frozen=True, slots=True)
class RunResult:
    values: np.ndarray  # float32 rows in input order
    real_tokens: int
    padded_tokens: int
    micro_batches: int

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


class BatchRunner(ABC):
    """Maps unpadded token-id sequences to output rows; subclasses supply the padded forward pass."""

    backend: str = "base"
    graph: str = "graph"  # how the forward pass runs: the torch backend says eager or trace

    def __init__(self, model: ResolvedModel, pad_id: int) -> None:
        self.model_info = model
        self.task = model.manifest.task
        self.pad_id = pad_id
        self.output_size = model.output_size
        self.cap = AdaptiveBatchCap(ceiling=DEFAULT_LIMITS.max_sequences)
        self.fatal_error: str | None = None
        self.injected_error: Exception | None = None  # fault injection: raised by the next forward pass
        self.parallel = 1
        self._pool: ThreadPoolExecutor | None = None
        self._cap_lock = threading.Lock()  # passes of one batch may finish on different threads

    @property
    @abstractmethod
    def device_name(self) -> str: ...

    @abstractmethod
    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, longest) int64 ids and mask -> (batch, output_size) float32."""

    def set_parallel(self, passes: int) -> None:
        """Run up to ``passes`` forward passes of a batch at once, each on its own thread (CPU: pair with
        one intra-op thread each; a busy machine descheduling one thread of a 2-thread pool stalls both)."""
        self.parallel = max(1, passes)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = (
            ThreadPoolExecutor(self.parallel, thread_name_prefix="pass") if self.parallel > 1 else None
        )

    def _release_memory(self) -> None:  # noqa: B027 - optional hook
        """Give cached device memory back after an out-of-memory error (device backends override)."""

    def _after_batch(self) -> None:  # noqa: B027 - optional hook
        """Hook after each successful micro-batch (device backends release cache above a threshold)."""

    def run(self, sequences: Sequence[np.ndarray], limits: BatchLimits = DEFAULT_LIMITS) -> RunResult:
        n = len(sequences)
        out = np.empty((n, self.output_size), dtype=np.float32)
        if n == 0:
            return RunResult(out, 0, 0, 0)
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=n)
        if self.cap.ceiling != limits.max_sequences:
            self.cap.set_ceiling(limits.max_sequences)
        per_pass = min(limits.max_sequences, self.cap.current)
        if self.parallel > 1:  # at least one pass per thread: -(-n // k) is ceil(n / k)
            per_pass = min(per_pass, -(-n // self.parallel))
        plan = plan_micro_batches(lengths, BatchLimits(per_pass, limits.max_tokens))
        if self._pool is not None and len(plan) > 1:
            # Longest passes first (the plan is ascending), so no thread starts the longest pass last
            # while the others idle. Disjoint rows of `out` per pass; list()
            # re-raises the first failure here.
            list(self._pool.map(lambda idx: self._run_indices(idx, sequences, lengths, out), plan[::-1]))
        else:
            for idx in plan:
                self._run_indices(idx, sequences, lengths, out)
        padded = round(float(lengths.sum()) / padding_efficiency(lengths, plan))
        return RunResult(out, int(lengths.sum()), padded, len(plan))

    def _run_indices(
        self, idx: np.ndarray, sequences: Sequence[np.ndarray], lengths: np.ndarray, out: np.ndarray
    ) -> None:
        try:
            if self.injected_error is not None:
                injected, self.injected_error = self.injected_error, None
                raise injected
            out[idx] = self._forward(*self._pad([sequences[i] for i in idx], int(lengths[idx].max())))
        except Exception as exc:
            if is_unrecoverable_device_error(exc):
                self.fatal_error = (
                    f"{type(exc).__name__}: {exc}"  # check_health reports it; Serve replaces us
                )
            if not is_out_of_memory(exc) or len(idx) == 1:
                raise
            with self._cap_lock:
                self.cap.on_oom(len(idx))
            self._release_memory()
            half = len(idx) // 2
            self._run_indices(idx[:half], sequences, lengths, out)
            self._run_indices(idx[half:], sequences, lengths, out)
            return
        with self._cap_lock:
            self.cap.on_success()
        self._after_batch()

    def _pad(self, seqs: list[np.ndarray], longest: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full((len(seqs), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), longest), dtype=np.int64)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = s
            mask[row, : len(s)] = 1
        return ids, mask

    def warm_up(self, max_tokens: int, max_batch: int) -> None:
        """Run short and long batches once so the first real request pays no lazy-init cost."""
        short = np.full(4, self.pad_id + 1, dtype=np.int32)
        long = np.full(max_tokens, self.pad_id + 1, dtype=np.int32)
        self.run([short])
        self.run([short, long] * max(1, min(max_batch, 8) // 2))
        log.info("warm-up done: %s on %s", self.backend, self.device_name)

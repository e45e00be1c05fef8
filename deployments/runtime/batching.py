"""Pure batching policy (no Ray, no torch): token-budget micro-batch plans, the adaptive wait
window, and the batch cap that backs off on out-of-memory errors."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("textserve.batching")


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Bounds on one batch: sequences, and padded tokens (longest length x count)."""

    max_sequences: int
    max_tokens: int

    def size_of(self, sequences: int, longest: int) -> int:
        """Batch size in units of ``max_sequences`` so that one number bounds both limits.

        ``@serve.batch`` compares a single size against ``max_batch_size``: a batch is full when
        either the sequence count or the padded-token count reaches its limit.
        """
        by_count = sequences / self.max_sequences
        by_tokens = sequences * longest / self.max_tokens
        return math.ceil(max(by_count, by_tokens) * self.max_sequences - 1e-9)


def plan_micro_batches(lengths: np.ndarray, limits: BatchLimits) -> list[np.ndarray]:
    """Cut length-sorted sequence indices into micro-batches within ``limits``.

    Sorting puts similar lengths together so little compute is spent on padding. A sequence longer
    than the token budget runs alone: nothing is ever left out.
    """
    order = np.argsort(lengths, kind="stable")
    plan: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        end = start + 1
        # Ascending order: the newest member is the longest, so the padded size is len * count.
        while (
            end < n
            and end - start < limits.max_sequences
            and int(lengths[order[end]]) * (end - start + 1) <= limits.max_tokens
        ):
            end += 1
        plan.append(order[start:end])
        start = end
    return plan


def padding_efficiency(lengths: np.ndarray, plan: list[np.ndarray]) -> float:
    """Real tokens / padded tokens over a plan (1.0 means no padding at all)."""
    padded = sum(len(idx) * int(lengths[idx].max()) for idx in plan if len(idx))
    return float(lengths.sum()) / padded if padded else 1.0


@dataclass(slots=True)
class AdaptiveWaitWindow:
    """Feedback on ``batch_wait_timeout_s``: batches that stay far below the cap shrink the window
    (waiting buys nothing at low load); batches that hit the cap grow it (there is traffic to wait
    for), always within ``[min_s, max_s]``. The window stays a maximum wait: full batches leave at once.
    """

    current_s: float
    min_s: float
    max_s: float
    low_fill: float = 0.25
    high_fill: float = 0.9
    shrink: float = 0.7
    grow: float = 1.25
    smoothing: float = 0.2
    fill_ewma: float = 0.5

    def __post_init__(self) -> None:
        self.current_s = min(self.max_s, max(self.min_s, self.current_s))

    def observe(self, batch_size: int, cap: int) -> float:
        fill = min(1.0, batch_size / max(cap, 1))
        self.fill_ewma += self.smoothing * (fill - self.fill_ewma)
        if self.fill_ewma <= self.low_fill:
            self.current_s = max(self.min_s, self.current_s * self.shrink)
        elif self.fill_ewma >= self.high_fill:
            self.current_s = min(self.max_s, max(self.current_s, 1e-4) * self.grow)
        return self.current_s


@dataclass(slots=True)
class AdaptiveBatchCap:
    """The sequences-per-micro-batch cap under memory pressure: halved on out-of-memory, raised
    again by a quarter after ``recovery_batches`` clean batches in a row, never above ``ceiling``."""

    ceiling: int
    current: int = 0
    recovery_batches: int = 50
    clean_streak: int = 0

    def __post_init__(self) -> None:
        if self.current <= 0 or self.current > self.ceiling:
            self.current = self.ceiling

    def on_oom(self, failed_size: int) -> int:
        before = self.current
        self.current = max(1, min(self.current, failed_size) // 2)
        self.clean_streak = 0
        log.warning("out of memory on a batch of %d: batch cap %d -> %d", failed_size, before, self.current)
        return self.current

    def on_success(self) -> int:
        self.clean_streak += 1
        if self.current < self.ceiling and self.clean_streak >= self.recovery_batches:
            self.current = min(self.ceiling, self.current + max(1, self.current // 4))
            self.clean_streak = 0
            log.info("batch cap raised to %d after clean batches", self.current)
        return self.current

    def set_ceiling(self, ceiling: int) -> None:
        """A new configured cap: follow it, unless out-of-memory back-off holds the cap lower."""
        backed_off = self.current < self.ceiling
        self.ceiling = ceiling
        self.current = min(self.current, ceiling) if backed_off else ceiling


_UNRECOVERABLE = (
    "cuda error",
    "device-side assert",
    "illegal memory access",
    "cudnn_status",
    "cublas_status",
    "unspecified launch failure",
    "cuda driver",
)


def is_unrecoverable_device_error(exc: BaseException) -> bool:
    """A device error after which the CUDA context is unusable: only a new process recovers."""
    text = str(exc).lower()
    return not is_out_of_memory(exc) and any(marker in text for marker in _UNRECOVERABLE)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM from torch, or an allocation failure from ONNX Runtime."""
    name = type(exc).__name__
    text = str(exc).lower()
    return name == "OutOfMemoryError" or "out of memory" in text or "failed to allocate memory" in text

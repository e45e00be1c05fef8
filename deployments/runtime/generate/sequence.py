"""What the engine holds and gives per request: a sequence's state, the events of its stream, the engine's
counts. Shared by the engine and its speculative step (no scheduling here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from transformers import DynamicCache

from deployments.runtime.generate.prefix_cache import PrefixStats
from deployments.runtime.generate.sampling import Sampler

Finish = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    request_id: str
    token_id: int | None  # None on a final event that carries no token
    finish: Finish | None = None
    error: str | None = None
    at: float = 0.0  # time.perf_counter() when it was emitted
    cancel_lag_steps: int = 0  # finish "cancelled": decode steps between cancel() and leaving the batch


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int  # queued or prefilling
    kv_slots_used: int  # reserved by the admitted requests: what admission checks against the total
    kv_slots_total: int
    steps: int
    kv_slots_allocated: int = 0  # held by the batch's buffers now: never above the total
    kv_slots_filled: int = 0  # of them, the rows x columns the batch attends over now
    prefix: PrefixStats | None = None  # prefix caching off: None
    spec: SpecCounts | None = None  # speculative decoding off: None
    preemptions: int = 0  # admission reserves the whole generation: never preempts


class EngineFullError(RuntimeError):
    """The waiting queue is at ``max_waiting``."""


Sink = Callable[[TokenEvent], None]


@dataclass(slots=True)
class Sequence:
    request_id: str
    prompt: list[int]
    max_new: int
    sampler: Sampler
    sink: Sink
    eos: frozenset[int]
    generated: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None
    prefilled: int = 0
    solo: bool = False  # was in a pack that failed: prefilled alone from now on
    looked_up: bool = False  # its prompt was looked up in the prefix cache (once per request)
    cached: int = 0  # its prompt's first tokens the prefix cache held

    @property
    def reserve(self) -> int:
        return len(self.prompt) + self.max_new


@dataclass(slots=True)
class SpecCounts:
    """Since start: what the speculative steps did (the metrics' counters)."""

    proposed: int = 0  # tokens proposed
    accepted: int = 0  # of them, kept
    checks: int = 0  # rows checked (one per row per speculative step)
    tokens: int = 0  # tokens those checks gave (accepted + the model's own): tokens per check

"""Requests waiting for admission, by their tenant's class: who the engine admits next.

Interactive requests are admitted first, but every ``BATCH_TURN``-th admission goes to a waiting bulk one, so
bulk is never starved: the encoders' guaranteed bulk share (``PipelineConfig.batch_min_share``). The engine
holds its lock around every call.
"""

from __future__ import annotations

import collections
from collections.abc import Container

from contracts.tokenized import Priority
from deployments.runtime.generate.sequence import Sequence
from deployments.user_config import PipelineConfig

BATCH_TURN = max(1, round(1 / max(PipelineConfig().batch_min_share, 0.01)))


class Waiting:
    def __init__(self) -> None:
        self._queues: dict[Priority, collections.deque[Sequence]] = {
            "interactive": collections.deque(),
            "batch": collections.deque(),
        }
        self._since_batch = 0  # admissions since the last bulk one

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def push(self, seq: Sequence, priority: Priority) -> None:
        self._queues[priority].append(seq)

    def head(self) -> Sequence | None:
        """The request admitted next, left waiting."""
        queue = self._next()
        return queue[0] if queue is not None else None

    def pop(self) -> Sequence:
        """Take the request ``head`` named."""
        queue = self._next()
        assert queue is not None, "pop() after head() gave None"
        self._since_batch = 0 if queue is self._queues["batch"] else self._since_batch + 1
        return queue.popleft()

    def remove(self, request_ids: Container[str]) -> list[Sequence]:
        """Take every waiting request whose id is in ``request_ids`` (cancelled before admission)."""
        gone: list[Sequence] = []
        for priority, queue in self._queues.items():
            gone += [s for s in queue if s.request_id in request_ids]
            self._queues[priority] = collections.deque(s for s in queue if s.request_id not in request_ids)
        return gone

    def _next(self) -> collections.deque[Sequence] | None:
        interactive, batch = self._queues["interactive"], self._queues["batch"]
        if batch and (not interactive or self._since_batch >= BATCH_TURN - 1):
            return batch
        return interactive or None

"""What the batch queue of ``Inference`` holds, and how it sizes a batch (sequences, padded tokens).

In-process only: the queue is the replica's own (``pipeline/inference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.tokenized import EncodedTexts
from deployments.pipeline.group_runner import Group
from deployments.runtime.batching import BatchLimits
from deployments.user_config import BatchingConfig

_DEFAULTS = BatchingConfig()


class ReplicaLimits:
    """``@serve.batch``'s ``batch_size_fn`` is a plain function, so the limits it reads live here.
    Ray Serve runs one replica per process, so this is per replica; ``reconfigure`` updates it."""

    limits = BatchLimits(_DEFAULTS.max_batch_size, _DEFAULTS.max_batch_tokens)


@dataclass(slots=True, eq=False)
class QueuedGroup:
    """A group waiting in this replica's batch queue (in-process only)."""

    group: Group
    arrived_s: float  # perf_counter, for the queue-wait metric
    arrived_ns: int  # epoch ns, for trace spans (shared clock across processes)
    started: bool = False
    busy_s: float = 0.0  # the model time of the batch it ran in

    @property
    def requests(self) -> int:
        return sum(isinstance(e, EncodedTexts) for e in self.group)


def batch_size(queued: list[QueuedGroup]) -> int:
    limits = ReplicaLimits.limits
    groups = [q.group for q in queued]
    encoded = [e for group in groups for e in group if isinstance(e, EncodedTexts)]
    if not encoded:
        return 1
    size = limits.size_of(sum(len(e) for e in encoded), max(e.longest for e in encoded))
    # A lone group over the budget must still run (alone), never be refused by the batch queue.
    return min(size, limits.max_sequences) if len(groups) == 1 else size

"""Which priority class goes first: interactive first, bulk never starved (no Ray). The one priority
mechanism for encoders: the pipeline's groups (``PriorityScheduler`` in ``SlotBatcher``) and Inference's batch
queue (``PriorityGate``) follow the same ``PriorityPolicy``.

A tenant's requests are ``interactive`` or ``batch`` (its policy in the tenants file). Groups never mix the
two: an interactive request must not wait for a bulk request's texts. When a slot frees and both classes
wait, interactive work goes first unless bulk work's share of the recent busy time (a window that decays
with ``half_life_s``) is under ``batch_min_share``. Bulk groups also hold at most ``batch_slots`` slots at
once, so a slot is always free for interactive work within one group's time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from contracts.tokenized import Priority

PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")  # most urgent first


@dataclass(frozen=True, slots=True)
class PriorityPolicy:
    batch_slots: int = 1  # bulk groups in flight at once, at most
    batch_min_share: float = 0.25  # of the recent busy time, guaranteed to bulk work while it waits
    half_life_s: float = 2.0


class PriorityScheduler:
    def __init__(self, policy: PriorityPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self.in_flight: dict[Priority, int] = dict.fromkeys(PRIORITIES, 0)
        self._busy: dict[Priority, float] = dict.fromkeys(PRIORITIES, 0.0)
        self._at = clock()

    def _decay(self) -> None:
        now = self._clock()
        factor = math.pow(0.5, (now - self._at) / self.policy.half_life_s) if now > self._at else 1.0
        self._busy = {p: v * factor for p, v in self._busy.items()}
        self._at = now

    def share(self, priority: Priority) -> float:
        """``priority``'s part of the recent busy time (0 when nothing ran lately)."""
        self._decay()
        total = sum(self._busy.values())
        return self._busy[priority] / total if total > 0 else 0.0

    def choose(self, waiting: set[Priority]) -> Priority | None:
        """The class whose group forms next, or None when every waiting class must wait for a slot."""
        eligible = [p for p in PRIORITIES if p in waiting and self._has_slot(p)]
        if not eligible:
            return None
        if len(eligible) > 1 and self.share("batch") < self.policy.batch_min_share:
            return "batch"
        return eligible[0]

    def _has_slot(self, priority: Priority) -> bool:
        return priority != "batch" or self.in_flight["batch"] < self.policy.batch_slots

    def started(self, priority: Priority) -> None:
        self.in_flight[priority] += 1

    def finished(self, priority: Priority, seconds: float) -> None:
        self.in_flight[priority] -= 1
        self._decay()
        self._busy[priority] += seconds


class PriorityGate:
    """Admission into a first-come batch queue (Inference's ``@serve.batch``) by the same policy, so
    interactive work goes first where the model's batches form, on a GPU as on a CPU.

    An interactive group enters at once. A bulk group enters while fewer than ``batch_slots`` bulk groups are
    inside and no interactive group is, or while bulk's share of the recent busy time is under
    ``batch_min_share`` (never starved); otherwise it waits, first come first served among bulk groups. So an
    interactive group waits behind at most ``batch_slots`` bulk groups, never behind a queue of them.
    """

    def __init__(self, policy: PriorityPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.scheduler = PriorityScheduler(policy, clock)
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Bulk groups held at the gate now."""
        return sum(not f.done() for f in self._waiting)

    async def enter(self, priority: Priority) -> None:
        """Returns once the group may join the queue; pair every return with one ``leave``."""
        if priority != "batch" or (not self.waiting and self._admits_batch()):
            self.scheduler.started(priority)
            return
        admitted = asyncio.get_running_loop().create_future()
        self._waiting.append(admitted)
        try:
            await admitted
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():  # admitted as it was cancelled: give it back
                self.leave("batch", 0.0)
            raise

    def leave(self, priority: Priority, busy_s: float) -> None:
        """The group is answered; ``busy_s``: the model time it took, its class's share of busy time."""
        self.scheduler.finished(priority, busy_s)
        while self._waiting and (self._waiting[0].done() or self._admits_batch()):
            admitted = self._waiting.popleft()
            if not admitted.done():  # a cancelled waiter is skipped
                self.scheduler.started("batch")
                admitted.set_result(None)

    def _admits_batch(self) -> bool:
        scheduler = self.scheduler
        if scheduler.in_flight["batch"] >= scheduler.policy.batch_slots:
            return False
        return scheduler.in_flight["interactive"] == 0 or (
            scheduler.share("batch") < scheduler.policy.batch_min_share
        )

"""A batcher whose batches form when a slot frees up (no Ray).

Ray Serve's ``@serve.batch`` forms the next batch as soon as its wait window ends and only then waits for
a free slot (``max_concurrent_batches``): with a short window, batches of one queue up behind the batch that
runs, and a request that arrives meanwhile cannot join them. Here a batch forms at the moment a slot is
free: it takes everything queued then (up to the cap). The window stays a maximum, never a minimum: a free
slot waits for company only while the batch is under the cap, and at most ``wait_s`` (0: never).

Items have a priority class (``priority_of``): a batch holds one class only, and which class forms the next
batch is the ``PriorityScheduler``'s choice (interactive first, bulk with a guaranteed share).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from deployments.pipeline.detached import start_detached
from deployments.pipeline.priority import PRIORITIES, Priority, PriorityPolicy, PriorityScheduler

log = logging.getLogger("textserve.batching")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Waiting(Generic[T, R]):
    item: T
    future: asyncio.Future[R] = field(repr=False)


class BatchCancelledError(RuntimeError):
    """The batch's handler was cancelled while it ran, though nobody cancelled the batcher."""


def _interactive(_: object) -> Priority:
    return "interactive"


class SlotBatcher(Generic[T, R]):
    """``await batcher.submit(item)`` runs ``handler`` on a batch holding ``item``; every caller gets its own
    result, or the batch's exception. ``slots`` batches run at once."""

    def __init__(
        self,
        handler: Callable[[list[T]], Awaitable[list[R]]],
        max_batch_size: int,
        wait_s: float = 0.0,
        slots: int = 1,
        size_fn: Callable[[list[T]], int] = len,
        priority_of: Callable[[T], Priority] = _interactive,
        priorities: PriorityPolicy | None = None,
        cost_of: Callable[[T], int] | None = None,
        max_batch_cost: int = 0,
    ) -> None:
        """``size_fn``: a batch's size against ``max_batch_size`` (default: items); a first item over the cap
        still runs, alone. ``cost_of``: an item's cost, a second cap on a batch (``max_batch_cost``, its sum)
        beside its size. ``priorities``: default, bulk batches may take every slot but one."""
        self._handler = handler
        self._size = size_fn
        self._cost_of = cost_of
        self.max_batch_cost = max_batch_cost
        self._priority_of = priority_of
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._slots = slots
        self.scheduler = PriorityScheduler(priorities or PriorityPolicy(batch_slots=max(1, slots - 1)))
        self._queues: dict[Priority, deque[_Waiting[T, R]]] = {p: deque() for p in PRIORITIES}
        self._changed: asyncio.Event | None = None  # an arrival, or a slot freed
        self._workers: list[asyncio.Task[None]] = []
        self.sizes: deque[int] = deque(maxlen=256)  # recent batch sizes, for stats and tests

    async def submit(self, item: T) -> R:
        if not self._workers:
            self._start()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queues[self._priority_of(item)].append(_Waiting(item, future))
        assert self._changed is not None
        self._changed.set()
        return await future  # a cancelled caller's future is skipped when its batch forms

    def _start(self) -> None:
        self._changed = asyncio.Event()
        # Detached: the workers serve every later request, not only the one that started them.
        self._workers = [start_detached(self._slot()) for _ in range(self._slots)]

    async def _take(self) -> tuple[Priority, list[_Waiting[T, R]]]:
        assert self._changed is not None
        while (priority := self.scheduler.choose({p for p in PRIORITIES if self._live(p)})) is None:
            self._changed.clear()
            await self._changed.wait()
        self.scheduler.started(priority)  # now, before the window: the other slots see its cap taken
        if self.wait_s > 0 and not self._full(self._queued(priority)):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            while not self._full(self._queued(priority)) and (left := deadline - loop.time()) > 0:
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    break
        queue = self._queues[priority]
        batch: list[_Waiting[T, R]] = []
        while self._live(priority):
            waiting = queue[0]  # _live dropped the cancelled ones ahead of it
            if batch and self._over([w.item for w in [*batch, waiting]]):
                break  # it starts the next batch
            batch.append(queue.popleft())
        return priority, batch

    def _queued(self, priority: Priority) -> list[T]:
        return [w.item for w in self._queues[priority] if not w.future.done()]

    def _cost(self, items: list[T]) -> int:
        return sum(map(self._cost_of, items)) if self._cost_of is not None else 0

    def _over(self, items: list[T]) -> bool:
        return self._size(items) > self.max_batch_size or (
            self._cost_of is not None and self._cost(items) > self.max_batch_cost
        )

    def _full(self, items: list[T]) -> bool:
        if not items:
            return False
        return self._size(items) >= self.max_batch_size or (
            self._cost_of is not None and self._cost(items) >= self.max_batch_cost
        )

    def _live(self, priority: Priority) -> bool:
        queue = self._queues[priority]
        while queue and queue[0].future.done():
            queue.popleft()
        return bool(queue)

    async def _slot(self) -> None:
        while True:
            priority, batch = await self._take()
            start = time.monotonic()
            if not batch:
                self.scheduler.finished(priority, 0.0)
                continue
            self.sizes.append(len(batch))
            try:
                await self._run(batch)
            finally:
                self.scheduler.finished(priority, time.monotonic() - start)
                assert self._changed is not None
                self._changed.set()  # a slot is free: a class held back by its slot cap may go

    async def _run(self, batch: list[_Waiting[T, R]]) -> None:
        # The handler runs as a task of its own so that its being cancelled from inside (a call it awaits
        # cancelled by someone else) tells apart from this slot being cancelled: the first fails the batch
        # and the slot goes on; only the second ends the slot.
        work = asyncio.ensure_future(self._handler([w.item for w in batch]))
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            work.cancel()
            for w in batch:
                if not w.future.done():
                    w.future.cancel()
            raise
        try:
            if work.cancelled():
                raise BatchCancelledError(f"a batch of {len(batch)} was cancelled while it ran")
            results = work.result()
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
        except Exception as exc:  # every caller of the batch gets the error; nobody hangs
            log.exception("a batch of %d failed as a whole", len(batch))
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        for w, result in zip(batch, results, strict=True):
            if not w.future.done():
                w.future.set_result(result)

"""A batcher whose batches form when a slot frees up (no Ray).

Ray Serve's ``@serve.batch`` forms the next batch as soon as its wait window ends and only then waits for
a free slot (``max_concurrent_batches``): with a short window, batches of one queue up behind the batch that
runs, and a request that arrives meanwhile cannot join them. Here a batch forms at the moment a slot is
free: it takes everything queued then (up to the cap). The window stays a maximum, never a minimum: a free
slot waits for company only while the batch is under the cap, and at most ``wait_s`` (0: never).
Measured in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger("textserve.batching")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Waiting(Generic[T, R]):
    item: T
    future: asyncio.Future[R] = field(repr=False)


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
    ) -> None:
        """``size_fn``: a batch's size against ``max_batch_size`` (default: items); a first item over the cap
        still runs, alone."""
        self._handler = handler
        self._size = size_fn
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._slots = slots
        self._queue: deque[_Waiting[T, R]] = deque()
        self._arrived: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self.sizes: deque[int] = deque(maxlen=256)  # recent batch sizes, for stats and tests

    async def submit(self, item: T) -> R:
        if not self._workers:
            self._start()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(item, future))
        assert self._arrived is not None
        self._arrived.set()
        return await future  # a cancelled caller's future is skipped when its batch forms

    def _start(self) -> None:
        self._arrived = asyncio.Event()
        self._workers = [asyncio.get_running_loop().create_task(self._slot()) for _ in range(self._slots)]

    async def _take(self) -> list[_Waiting[T, R]]:
        assert self._arrived is not None
        while not self._live():
            self._arrived.clear()
            await self._arrived.wait()
        if self.wait_s > 0 and self._queued_size() < self.max_batch_size:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            while self._queued_size() < self.max_batch_size and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
        batch: list[_Waiting[T, R]] = []
        while self._live():
            waiting = self._queue[0]  # _live dropped the cancelled ones ahead of it
            if batch and self._size([w.item for w in [*batch, waiting]]) > self.max_batch_size:
                break  # it starts the next batch
            batch.append(self._queue.popleft())
        return batch

    def _queued_size(self) -> int:
        items = [w.item for w in self._queue if not w.future.done()]
        return self._size(items) if items else 0

    def _live(self) -> bool:
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        return bool(self._queue)

    async def _slot(self) -> None:
        while True:
            batch = await self._take()
            if not batch:
                continue
            self.sizes.append(len(batch))
            try:
                results = await self._handler([w.item for w in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
            except Exception as exc:  # every caller of the batch gets the error; nobody hangs
                log.exception("a batch of %d failed as a whole", len(batch))
                for w in batch:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            except asyncio.CancelledError:
                for w in batch:
                    if not w.future.done():
                        w.future.cancel()
                raise
            for w, result in zip(batch, results, strict=True):
                if not w.future.done():
                    w.future.set_result(result)

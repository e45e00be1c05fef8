"""The slot batcher: a batch forms when a slot frees up, its window is a maximum (no Ray)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from deployments.pipeline.slot_batcher import BatchCancelledError, SlotBatcher


def _run(coro):
    return asyncio.run(coro)


def test_requests_that_arrive_while_a_batch_runs_form_the_next_batch_whole():
    async def scenario() -> list[int]:
        release = asyncio.Event()

        async def handler(items: list[int]) -> list[int]:
            await release.wait()
            return [i * 10 for i in items]

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=64, wait_s=0.0, slots=1)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.01)  # the first leaves alone at once: nothing else was queued
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 8)]
        await asyncio.sleep(0.01)
        release.set()
        assert await first == 0 and [await r for r in rest] == [i * 10 for i in range(1, 8)]
        return list(batcher.sizes)

    # Serve's @serve.batch with a window of 0 would have made seven batches of one here.
    assert _run(scenario()) == [1, 7]


def test_a_lone_request_never_waits_for_the_window_when_it_is_zero_and_at_most_the_window_otherwise():
    async def timed(wait_s: float) -> float:
        async def handler(items: list[str]) -> list[str]:
            return items

        batcher: SlotBatcher[str, str] = SlotBatcher(handler, max_batch_size=8, wait_s=wait_s)
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await batcher.submit("alone") == "alone"
        return loop.time() - start

    assert _run(timed(0.0)) < 0.05
    assert 0.15 <= _run(timed(0.2)) < 1.0


def test_the_cap_and_the_size_function_bound_a_batch_and_an_oversized_item_runs_alone():
    async def scenario() -> list[int]:
        gate = asyncio.Event()

        async def handler(items: list[int]) -> list[int]:
            await gate.wait()
            return items

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=10, size_fn=sum)
        futures = [asyncio.ensure_future(batcher.submit(n)) for n in (4, 4, 4, 30, 1)]
        await asyncio.sleep(0.01)
        gate.set()
        assert [await f for f in futures] == [4, 4, 4, 30, 1]
        return list(batcher.sizes)

    assert _run(scenario()) == [2, 1, 1, 1]  # 4+4, then 4 (4+30 > 10), then 30 alone, then 1


def test_a_cost_cap_bounds_a_batch_beside_its_count_and_an_item_over_it_runs_alone():
    async def scenario() -> list[list[int]]:
        gate = asyncio.Event()
        batches: list[list[int]] = []

        async def handler(items: list[int]) -> list[int]:
            batches.append(items)
            await gate.wait()
            return items

        # Items are their own cost (texts in a request): at most 3 per batch and at most 512 texts.
        batcher: SlotBatcher[int, int] = SlotBatcher(
            handler, max_batch_size=3, cost_of=lambda n: n, max_batch_cost=512
        )
        sizes = (256, 256, 256, 1, 1, 1, 1, 600, 32)
        futures = [asyncio.ensure_future(batcher.submit(n)) for n in sizes]
        await asyncio.sleep(0.01)
        gate.set()
        assert [await f for f in futures] == list(sizes)
        return batches

    assert _run(scenario()) == [[256, 256], [256, 1, 1], [1, 1], [600], [32]]


@pytest.mark.parametrize(
    ("raised", "expected", "match"),
    [
        (ValueError("boom"), ValueError, "boom"),
        # What awaiting a DeploymentResponse raises when someone else cancelled it (Serve cancels a request's
        # child calls): the batch's callers get an error, and the same slot serves the next batch.
        (asyncio.CancelledError(), BatchCancelledError, "a batch of 3 was cancelled"),
    ],
)
def test_a_failing_batch_fails_every_caller_and_the_next_batch_still_runs(
    raised: BaseException, expected: type[Exception], match: str
) -> None:
    async def scenario() -> None:
        calls = 0

        async def handler(items: list[int]) -> list[int]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise raised
            return items

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=4, slots=1)
        first = [asyncio.ensure_future(batcher.submit(i)) for i in range(3)]
        for f in first:
            with pytest.raises(expected, match=match):
                await f
        assert await asyncio.wait_for(batcher.submit(9), 5) == 9

    _run(scenario())


def test_a_wrong_number_of_results_is_an_error_for_every_caller():
    async def scenario() -> None:
        async def handler(items: list[int]) -> list[int]:
            return items[:-1]

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=4)
        futures = [asyncio.ensure_future(batcher.submit(i)) for i in range(2)]
        for f in futures:
            with pytest.raises(RuntimeError, match="1 results for a batch of 2"):
                await f

    _run(scenario())


def test_a_caller_that_leaves_before_its_batch_forms_is_skipped():
    async def scenario() -> list[list[int]]:
        seen: list[list[int]] = []
        gate = asyncio.Event()

        async def handler(items: list[int]) -> list[int]:
            seen.append(items)
            await gate.wait()
            return items

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=8)
        running = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(batcher.submit(1))
        kept = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.01)
        gone.cancel()
        gate.set()
        assert await running == 0 and await kept == 2
        return seen

    assert _run(scenario()) == [[0], [2]]


def test_the_workers_run_in_a_context_of_their_own_not_the_first_submitters() -> None:
    request: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)

    async def scenario() -> list[str | None]:
        seen: list[str | None] = []

        async def handler(items: list[int]) -> list[int]:
            seen.append(request.get())  # Serve records the handle calls made here under this variable
            return items

        batcher: SlotBatcher[int, int] = SlotBatcher(handler, max_batch_size=4, slots=2)

        async def submit_as(name: str, item: int) -> int:
            request.set(name)
            return await batcher.submit(item)

        assert await asyncio.ensure_future(submit_as("first", 1)) == 1
        assert await asyncio.ensure_future(submit_as("second", 2)) == 2
        return seen

    assert _run(scenario()) == [None, None]

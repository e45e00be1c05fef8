"""Priority classes in the pipeline's groups: interactive first, bulk capped in slots and never starved."""

from __future__ import annotations

import asyncio

from deployments.pipeline.priority import Priority, PriorityGate, PriorityPolicy, PriorityScheduler
from deployments.pipeline.slot_batcher import SlotBatcher


def _class_of(item: str) -> Priority:
    return "batch" if "bulk" in item else "interactive"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interactive_goes_first_until_bulk_falls_under_its_share():
    clock = Clock()
    scheduler = PriorityScheduler(PriorityPolicy(batch_slots=1, batch_min_share=0.25), clock)
    both = {"interactive", "batch"}
    assert scheduler.choose(both) == "batch"  # nothing ran yet: bulk's share is 0, under 25 %
    scheduler.started("batch")
    clock.now += 1.0
    scheduler.finished("batch", 1.0)
    assert scheduler.choose(both) == "interactive"  # bulk has had all of the busy time
    for _ in range(3):
        scheduler.started("interactive")
        clock.now += 1.0
        scheduler.finished("interactive", 1.0)
    assert scheduler.share("batch") < 0.25 and scheduler.choose(both) == "batch"  # starving: its turn


def test_bulk_holds_at_most_its_slots_and_the_rest_stay_free_for_interactive():
    scheduler = PriorityScheduler(PriorityPolicy(batch_slots=1))
    scheduler.started("batch")
    assert scheduler.choose({"batch"}) is None  # its one slot is taken: it waits
    assert scheduler.choose({"batch", "interactive"}) == "interactive"
    scheduler.finished("batch", 0.1)
    assert scheduler.choose({"batch"}) == "batch"
    assert scheduler.choose(set()) is None


def test_groups_never_mix_classes_and_interactive_overtakes_queued_bulk():
    async def scenario() -> tuple[list[list[str]], list[str]]:
        release = asyncio.Event()
        batches: list[list[str]] = []

        async def handler(items: list[str]) -> list[str]:
            batches.append(items)
            if items == ["bulk-0"]:
                await release.wait()  # the first bulk group holds its slot
            return items

        batcher: SlotBatcher[str, str] = SlotBatcher(
            handler,
            max_batch_size=8,
            slots=2,
            priority_of=lambda s: "batch" if "bulk" in s else "interactive",
        )
        batcher.scheduler.policy = PriorityPolicy(batch_slots=1, batch_min_share=0.0)
        order: list[str] = []

        async def submit(item: str) -> None:
            order.append(await batcher.submit(item))

        first = asyncio.ensure_future(submit("bulk-0"))
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(submit(f"bulk-{i}")) for i in (1, 2)]
        await asyncio.sleep(0.01)
        urgent = [asyncio.ensure_future(submit(f"query-{i}")) for i in range(3)]
        await asyncio.gather(*urgent)  # done while bulk-0 still holds the other slot
        assert not any(q.done() for q in queued)
        release.set()
        await asyncio.gather(first, *queued)
        return batches, order

    batches, order = asyncio.run(scenario())
    assert all(len({"bulk" in item for item in batch}) == 1 for batch in batches)
    assert order[:3] == ["query-0", "query-1", "query-2"]
    assert ["bulk-1", "bulk-2"] in batches  # the queued bulk requests formed one group, after


def test_a_stream_of_interactive_work_still_leaves_bulk_its_share():
    async def scenario() -> float:
        async def handler(items: list[str]) -> list[str]:
            await asyncio.sleep(0.005)
            return items

        batcher: SlotBatcher[str, str] = SlotBatcher(
            handler,
            max_batch_size=1,
            slots=2,
            priority_of=lambda s: "batch" if "bulk" in s else "interactive",
        )
        batcher.scheduler.policy = PriorityPolicy(batch_slots=1, batch_min_share=0.3, half_life_s=0.2)
        done: list[str] = []

        async def flood(prefix: str, n: int) -> None:
            async def one(i: int) -> None:
                done.append(await batcher.submit(f"{prefix}-{i}"))

            await asyncio.gather(*(one(i) for i in range(n)))

        await asyncio.wait_for(asyncio.gather(flood("query", 200), flood("bulk", 200)), 10)
        bulk_in_first_half = sum("bulk" in d for d in done[:200])
        return bulk_in_first_half / 200

    assert asyncio.run(scenario()) >= 0.25  # bulk got its share while interactive work kept coming


def test_the_gate_lets_interactive_groups_in_at_once_and_bulk_ones_one_at_a_time():
    """Inference's batch queue is first come, first served: the gate in front of it keeps bulk groups out
    while interactive ones are inside, so an interactive group waits behind one bulk group at most."""

    async def scenario() -> list[str]:
        clock = Clock()
        gate = PriorityGate(PriorityPolicy(batch_slots=1, batch_min_share=0.0), clock)
        entered: list[str] = []

        async def group(name: str, priority: Priority) -> None:
            await gate.enter(priority)
            entered.append(name)

        await group("bulk-1", "batch")  # nothing inside: in at once
        waiting = [asyncio.create_task(group(f"bulk-{i}", "batch")) for i in (2, 3)]
        await asyncio.sleep(0)
        assert gate.waiting == 2  # one bulk group at a time
        await group("query-1", "interactive")  # never held
        gate.leave("batch", 1.0)  # bulk-1 answered, but an interactive group is inside: bulk-2 still waits
        await asyncio.sleep(0)
        assert gate.waiting == 2
        gate.leave("interactive", 0.1)
        await asyncio.sleep(0)
        assert gate.waiting == 1  # bulk-2 in, bulk-3 behind it
        gate.leave("batch", 1.0)
        await asyncio.gather(*waiting)
        return entered

    assert asyncio.run(scenario()) == ["bulk-1", "query-1", "bulk-2", "bulk-3"]


def test_the_gate_never_starves_bulk_and_forgets_a_cancelled_waiter():
    async def scenario() -> None:
        clock = Clock()
        gate = PriorityGate(PriorityPolicy(batch_slots=1, batch_min_share=0.25, half_life_s=1.0), clock)
        await gate.enter("interactive")
        gate.leave("interactive", 10.0)  # interactive work took all the recent busy time
        await gate.enter("interactive")  # and is inside again
        await asyncio.wait_for(gate.enter("batch"), 1)  # bulk's share is 0 < 0.25: in beside it
        cancelled = asyncio.create_task(gate.enter("batch"))  # the slot is taken: it waits
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        gate.leave("batch", 1.0)
        assert gate.waiting == 0 and gate.scheduler.in_flight["batch"] == 0
        later = asyncio.create_task(gate.enter("batch"))  # the cancelled waiter holds no slot
        gate.leave("interactive", 0.1)
        await asyncio.wait_for(later, 1)
        assert gate.scheduler.in_flight["batch"] == 1

    asyncio.run(scenario())

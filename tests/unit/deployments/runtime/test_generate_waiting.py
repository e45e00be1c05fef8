"""Who the engine admits next: interactive first, every BATCH_TURN-th admission a waiting bulk request."""

from __future__ import annotations

from deployments.runtime.generate.sampling import Sampler, Sampling
from deployments.runtime.generate.sequence import Sequence
from deployments.runtime.generate.waiting import BATCH_TURN, Waiting


def _seq(request_id: str) -> Sequence:
    return Sequence(request_id, [1], 1, Sampler(Sampling()), lambda event: None, frozenset())


def _drain(waiting: Waiting) -> list[str]:
    order = []
    while (head := waiting.head()) is not None:
        taken = waiting.pop()
        assert taken is head
        order.append(taken.request_id)
    return order


def test_interactive_goes_first_and_bulk_gets_every_batch_turn() -> None:
    waiting = Waiting()
    for i in range(2 * BATCH_TURN):
        waiting.push(_seq(f"i{i}"), "interactive")
    for i in range(3):
        waiting.push(_seq(f"b{i}"), "batch")
    assert len(waiting) == 2 * BATCH_TURN + 3
    order = _drain(waiting)
    assert len(waiting) == 0 and sorted(order) == sorted(
        [f"i{i}" for i in range(2 * BATCH_TURN)] + ["b0", "b1", "b2"]
    )
    # Bulk gets the BATCH_TURN-th admission while interactive ones wait, then the rest once they are gone.
    first_bulk = order.index("b0")
    assert first_bulk == BATCH_TURN - 1
    assert order.index("b1") == 2 * BATCH_TURN - 1
    assert order[-1] == "b2"


def test_remove_takes_cancelled_requests_from_either_class() -> None:
    waiting = Waiting()
    for name, priority in (("a", "interactive"), ("b", "batch"), ("c", "interactive")):
        waiting.push(_seq(name), priority)  # type: ignore[arg-type]
    gone = waiting.remove({"a", "b"})
    assert sorted(s.request_id for s in gone) == ["a", "b"]
    assert len(waiting) == 1 and _drain(waiting) == ["c"]

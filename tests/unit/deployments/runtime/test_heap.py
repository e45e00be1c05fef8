"""Freezing the heap once a model has loaded: what gets left out of full collections, and Ray's switch."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from deployments.runtime import heap


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()  # what earlier tests froze stays collectable for later ones
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_loaded_objects_leave_the_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heap.RAY_SWITCH, raising=False)
    loaded = [_Node() for _ in range(100)]
    frozen = heap.freeze_loaded_heap()
    assert frozen >= len(loaded) and gc.get_freeze_count() > 0  # frozen objects freed since leave the count
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in tracked for node in loaded)  # never scanned again
    made_later = _Node()
    assert id(made_later) in {id(o) for o in gc.get_objects()}  # what requests leave is still collected


def test_rays_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(heap.RAY_SWITCH, "0")
    node = _Node()
    assert heap.freeze_loaded_heap() == 0 and gc.get_freeze_count() == 0
    assert id(node) in {id(o) for o in gc.get_objects()}

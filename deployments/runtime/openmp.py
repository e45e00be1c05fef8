"""Keep one OpenMP pool per model thread: set a model up on a thread that ends before the model runs.

PyTorch's CPU operators run on OpenMP (GNU libgomp in the Linux wheels). libgomp keeps a pool of worker
threads for every OS thread that has run a parallel region, for as long as that thread lives. Once the threads
in all pools outnumber the CPUs, libgomp stops its workers from spinning between regions: each one sleeps, and
every operator after that pays a wake-up on each core. A replica that loads and warms its model on the thread
that builds it, then runs it on a model thread of its own, has two pools; on the 2-core benchmark machine a
decode step of 8 rows went from 51 to 83 ms, its two threads busy 71 % and 48 % of the time instead of 100 %
(``python -m bench.openmp_pools``). A thread that ends takes its pool with it, so the model's own thread is
left with the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T], name: str = "model-setup") -> T:
    """``fn()`` (loading, packing or warming a model) on a new thread, ended when this returns: its OpenMP
    pool ends with it. Returns ``fn``'s result, or raises its exception here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]

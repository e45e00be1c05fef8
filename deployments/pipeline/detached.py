"""Background tasks that belong to the replica, not to the request that happened to start them (no Ray).

Ray Serve keeps the request being served in a context variable and records every handle call made under it
as that request's child, to cancel with it when its caller goes away (``ray/serve/_private/replica.py``:
``_on_request_cancelled``). An asyncio task inherits its creator's context: a batcher's worker or a loader
started by a request would make all its calls, for every later request too, as that one request's children,
and that client leaving (or a health probe timing out) would cancel them.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def start_detached(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``coro`` as a task on the running loop, in a fresh context (no request's variables)."""
    # Context.run rather than create_task(context=...): the latter needs Python 3.11.
    return contextvars.Context().run(asyncio.get_running_loop().create_task, coro)

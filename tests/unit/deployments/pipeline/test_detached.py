"""A replica's background work runs in a context of its own, not the request's that started it (no Ray)."""

from __future__ import annotations

import asyncio
import contextvars

from deployments.pipeline.detached import start_detached

# Stands in for Ray Serve's request context variable (ray.serve.context._serve_request_context).
REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)


def test_a_detached_task_sees_none_of_its_starters_context_and_a_plain_task_would() -> None:
    async def seen() -> str | None:
        return REQUEST.get()

    async def scenario() -> tuple[str | None, str | None]:
        REQUEST.set("first request")
        plain = asyncio.get_running_loop().create_task(seen())
        detached = start_detached(seen())
        return await plain, await detached

    plain, detached = asyncio.run(scenario())
    assert plain == "first request"  # the control: what a task inherits by default
    assert detached is None


def test_a_detached_task_outlives_the_request_task_that_started_it() -> None:
    async def scenario() -> str:
        done = asyncio.Event()
        background: list[asyncio.Task[str]] = []

        async def work() -> str:
            await done.wait()
            return "finished"

        async def request() -> None:
            background.append(start_detached(work()))
            await asyncio.sleep(10)

        handler = asyncio.ensure_future(request())
        await asyncio.sleep(0.01)
        handler.cancel()  # the request goes away
        await asyncio.gather(handler, return_exceptions=True)
        done.set()
        return await background[0]

    assert asyncio.run(scenario()) == "finished"

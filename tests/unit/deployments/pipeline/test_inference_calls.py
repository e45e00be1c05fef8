"""The pipeline's calls to Inference: over the link to a local replica whose card came by Serve's handle,
else by the handle; a group whose members all left cancels the call on the Inference side too."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.outputs import ResponseOptions
from contracts.tokenized import TokenizeJob
from deployments.link.frames import link_key, socket_path
from deployments.link.server import LinkServer
from deployments.pipeline.inference_calls import CARD_PERIOD_S, InferenceCalls
from deployments.pipeline.request_group import PipelineJob, RequestGroup

APP = "m"


@pytest.fixture
def sockets() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ic", dir="/tmp"))  # short: a socket path holds 107 bytes
    yield d / "node"
    shutil.rmtree(d)


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> asyncio.Task[Any]:  # a DeploymentResponse: awaitable, cancellable
        self.calls.append(args)
        return asyncio.ensure_future(self.fn(*args))


class FakeInferenceHandle:
    """Serve's handle to one Inference deployment: ``infer`` answers by handle; ``link_name``: its card."""

    deployment_name = "Inference"

    def __init__(self, socket_name: str | None) -> None:
        async def infer(encoded: list[Any], priority: str, share: float) -> list[Any]:
            return [("handle", e) for e in encoded]

        async def link_name() -> str | None:
            return socket_name

        self.infer = _Method(infer)
        self.link_name = _Method(link_name)


def _group(n: int = 2) -> RequestGroup:
    return RequestGroup(
        [PipelineJob(TokenizeJob([f"t{i}"]), ResponseOptions(route="predict")) for i in range(n)]
    )


async def _listening(sockets: Path, handler: Any) -> LinkServer:
    server = LinkServer(socket_path(sockets, link_key(APP, "Inference"), "r1"), handler)  # type: ignore[arg-type]
    server.start()
    await asyncio.sleep(0.05)
    return server


async def _linked_calls(sockets: Path, server: LinkServer | None, use_link: bool = True) -> tuple[Any, Any]:
    handle = FakeInferenceHandle(server.path.name if server is not None else None)
    calls = InferenceCalls({"1": handle}, use_link, APP, sockets)
    calls.start()
    await asyncio.sleep(0.1)  # the first round of cards
    return calls, handle


async def _by_link(request: tuple[list[Any], str, float]) -> list[Any]:
    encoded, priority, share = request
    return [("link", e, priority, share) for e in encoded]


def test_a_group_goes_over_the_link_to_a_local_replica_whose_card_came(sockets: Path) -> None:
    async def scenario() -> None:
        server = await _listening(sockets, _by_link)
        calls, handle = await _linked_calls(sockets, server)
        answers = await calls.infer("1", _group(), ["a", "b"], "batch", 0.3)
        assert answers == [("link", "a", "batch", 0.3), ("link", "b", "batch", 0.3)]
        assert handle.infer.calls == [] and handle.link_name.calls  # the card came by the handle
        calls.use_link = False  # the pipeline's user_config turns it off: the handle, at once
        assert await calls.infer("1", _group(1), ["c"], "interactive", 0.25) == [("handle", "c")]
        calls.stop()
        await server.close(1.0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_handle_carries_the_group_when_no_local_replica_listens(sockets: Path) -> None:
    async def scenario() -> None:
        server = await _listening(sockets, _by_link)
        # The card names no socket: that replica runs elsewhere (or has none). The local socket is not used,
        # so Serve's replica choice balances over every replica.
        handle = FakeInferenceHandle(None)
        calls = InferenceCalls({"1": handle}, True, APP, sockets)
        calls.start()
        await asyncio.sleep(0.1)
        assert await calls.infer("1", _group(1), ["a"], "interactive", 0.25) == [("handle", "a")]
        assert len(handle.infer.calls) == 1
        # Outside Serve (no application): no link at all, and no card calls.
        bare = FakeInferenceHandle(server.path.name)
        outside = InferenceCalls({"1": bare}, True, None, sockets)
        outside.start()
        await asyncio.sleep(0.05)
        assert await outside.infer("1", _group(1), ["b"], "interactive", 0.25) == [("handle", "b")]
        assert bare.link_name.calls == []
        calls.stop()
        await server.close(1.0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_group_whose_members_all_left_cancels_its_call_in_the_inference_replica(sockets: Path) -> None:
    async def scenario() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def slow(request: Any) -> list[Any]:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return []

        server = await _listening(sockets, slow)
        calls, _ = await _linked_calls(sockets, server)
        group = _group(2)
        call = asyncio.ensure_future(calls.infer("1", group, ["a", "b"], "interactive", 0.25))
        await asyncio.wait_for(started.wait(), 2)
        for job in group.jobs:
            job.abandon()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(cancelled.wait(), 2)  # the replica dropped it: no model time spent
        assert server.in_flight == 0
        calls.stop()
        await server.close(1.0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_replica_that_raised_is_an_error_of_the_call(sockets: Path) -> None:
    async def broken(request: Any) -> list[Any]:
        raise ValueError("boom")

    async def scenario() -> None:
        server = await _listening(sockets, broken)
        calls, _ = await _linked_calls(sockets, server)
        with pytest.raises(RuntimeError, match="ValueError: boom"):
            await calls.infer("1", _group(1), ["a"], "interactive", 0.25)
        calls.stop()
        await server.close(1.0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_cards_are_read_again_each_period(sockets: Path) -> None:
    async def scenario() -> None:
        server = await _listening(sockets, _by_link)
        calls, handle = await _linked_calls(sockets, server)
        first = len(handle.link_name.calls)
        await asyncio.sleep(CARD_PERIOD_S * 1.5)
        assert len(handle.link_name.calls) > first
        calls.stop()
        await server.close(1.0)

    asyncio.run(asyncio.wait_for(scenario(), 10))

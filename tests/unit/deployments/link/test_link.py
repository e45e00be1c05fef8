"""The link between the router and a local pipeline replica: answers, cancellation, shutdown, choice."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deployments.link import client as client_module
from deployments.link.client import KNOWN_FOR_S, SEEN_FOR_S, LinkBroken, LinkClient, LocalReplica
from deployments.link.frames import app_prefix, link_dir, socket_path, sweep_stale
from deployments.link.server import LinkServer


@pytest.fixture
def sockets() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="lk", dir="/tmp"))  # short: a socket path holds 107 bytes
    yield d / "node"
    shutil.rmtree(d)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def refreshed(client: LinkClient, directory: Path, apps: list[str]) -> LinkClient:
    """The router's refresh: rescan the directory, then the cards of every listening replica come in."""
    client.refresh(apps)
    for app in apps:
        for path in directory.glob(f"{app_prefix(app)}*.sock") if directory.is_dir() else ():
            client.saw(app, path.name)
    return client


@dataclass
class Linked:
    server: LinkServer
    client: LinkClient
    replica: LocalReplica


async def linked(sockets: Path, handler: Any, apps: tuple[str, ...] = ("m",)) -> Linked:
    """A listening replica of application "m" and a router that has read its card."""
    server = LinkServer(sockets / f"{app_prefix('m')}r1.sock", handler)
    server.start()
    await asyncio.sleep(0.05)
    client = refreshed(LinkClient(sockets, max_in_flight=4), sockets, list(apps))
    replica = client.pick("m")
    assert replica is not None
    return Linked(server, client, replica)


def test_a_request_and_its_answer_cross_and_the_connection_is_kept(sockets: Path) -> None:
    async def scenario() -> None:
        link = await linked(sockets, _double, ("m", "other"))
        server, client, replica = link.server, link.client, link.replica
        assert client.pick("other") is None
        for n in (1, 2, 3):
            reply = await client.call(replica, n)
            assert reply is not None and reply.answer == 2 * n and reply.error is None
        assert len(replica.idle) == 1  # one connection, reused
        assert replica.in_flight == 0 and server.in_flight == 0
        await server.close(1.0)

    run(scenario())


def test_a_handler_that_raises_is_an_error_reply_not_a_lost_request(sockets: Path) -> None:
    async def boom(_: Any) -> Any:
        raise ValueError("bad")

    async def scenario() -> None:
        link = await linked(sockets, boom)
        server, client, replica = link.server, link.client, link.replica
        reply = await client.call(replica, 1)
        assert reply is not None and reply.error == "ValueError: bad"
        reply = await client.call(replica, 2)  # the connection still serves
        assert reply is not None and reply.error is not None
        await server.close(1.0)

    run(scenario())


def test_a_caller_that_gives_up_cancels_the_request_in_the_replica(sockets: Path) -> None:
    started, cancelled = asyncio.Event(), []

    async def slow(_: Any) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def scenario() -> None:
        link = await linked(sockets, slow)
        server, client, replica = link.server, link.client, link.replica
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.call(replica, 1), 0.2)
        assert started.is_set()
        for _ in range(50):
            if cancelled:
                break
            await asyncio.sleep(0.02)
        assert cancelled == [True] and server.in_flight == 0
        assert replica.idle == [] and replica.in_flight == 0  # the hung-up connection is not reused
        await server.close(1.0)

    run(scenario())


def test_shutdown_finishes_what_is_in_flight_and_refuses_what_comes_after(sockets: Path) -> None:
    release = asyncio.Event()

    async def gated(n: Any) -> Any:
        await release.wait()
        return n

    async def scenario() -> None:
        link = await linked(sockets, gated)
        server, client, replica, path = link.server, link.client, link.replica, link.server.path
        idle = await client._connect(replica)  # a second connection, open before the shutdown
        assert idle is not None
        first = asyncio.ensure_future(client.call(replica, 7))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(server.close(5.0))
        await asyncio.sleep(0.05)
        assert not closing.done() and not path.exists()  # waits for the request it has
        replica.idle.append(idle)
        assert await client.call(replica, 8) is None  # refused on the open connection: by the handle
        assert replica.gone and client.pick("m") is None
        release.set()
        reply = await first
        assert reply is not None and reply.answer == 7
        await closing

    run(scenario())


def test_a_replica_that_dies_with_a_request_in_it_is_a_broken_link(sockets: Path) -> None:
    async def scenario() -> None:
        dying = asyncio.Event()

        async def die(_: Any) -> Any:
            dying.set()
            await asyncio.sleep(30)

        link = await linked(sockets, die)
        server, client, replica = link.server, link.client, link.replica
        call = asyncio.ensure_future(client.call(replica, 1))
        await dying.wait()
        assert server._server is not None
        server._server.close()
        for task in asyncio.all_tasks():  # the replica's process ends: its connections close
            if task.get_coro().__qualname__ == "LinkServer._connection":  # type: ignore[union-attr]
                task.cancel()
        with pytest.raises(LinkBroken):
            await call

    run(scenario())


def test_a_stale_socket_is_skipped_and_removed(sockets: Path) -> None:
    import socket

    sockets.mkdir(parents=True)
    path = sockets / f"{app_prefix('m')}dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # a file nobody listens on: what a crashed replica leaves
    s.close()

    async def scenario() -> None:
        client = LinkClient(sockets, 4)
        refreshed(client, sockets, ["m"])
        replica = client.pick("m")
        assert replica is not None
        assert await client.call(replica, 1) is None
        assert not path.exists() and client.pick("m") is None
        client.refresh(["m"])
        assert client.pick("m") is None

    run(scenario())


def test_the_least_loaded_local_replica_under_the_cap_takes_a_request(sockets: Path) -> None:
    sockets.mkdir(parents=True)
    for name in ("a", "b"):
        (sockets / f"{app_prefix('m')}{name}.sock").touch()
    (sockets / f"{app_prefix('n')}c.sock").touch()
    client = refreshed(LinkClient(sockets, max_in_flight=2), sockets, ["m"])
    assert len(client._replicas["m"]) == 2 and "n" not in client._replicas  # only the applications asked for
    assert client.card_calls("m") == 2 and client.card_calls("n") == 1  # a card call for each replica
    a, b = client._replicas["m"]
    a.in_flight, b.in_flight = 1, 0
    assert client.pick("m") is b
    b.in_flight = 2
    assert client.pick("m") is a
    a.in_flight = 2
    assert client.pick("m") is None  # both at the cap: Serve's handle
    client.max_in_flight = 0
    a.in_flight = b.in_flight = 0
    assert client.pick("m") is None  # 0 turns the link off
    (sockets / f"{app_prefix('m')}a.sock").unlink()
    client.max_in_flight = 2
    client.refresh(["m"])
    assert client._replicas["m"] == [b]  # the same object: its connections are kept


def test_a_replica_whose_card_stopped_coming_is_left_to_serve_s_drain(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sockets.mkdir(parents=True)
    old, new = (sockets / f"{app_prefix('m')}{n}.sock" for n in ("old", "new"))
    old.touch()
    now = [100.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: now[0])
    client = LinkClient(sockets, max_in_flight=4)
    client.refresh(["m"])
    assert client.pick("m") is None  # listening, but no card from it yet: Serve may not route to it
    client.saw("m", old.name)
    assert client.pick("m") is not None
    new.touch()  # a rollout: the new version's replica starts beside the old one
    client.refresh(["m"])
    client.saw("m", new.name)
    now[0] += SEEN_FOR_S / 2
    client.saw("m", new.name)  # Serve stopped the old one: its cards stop, the new one's keep coming
    now[0] += SEEN_FOR_S / 2 + 0.1
    replica = client.pick("m")
    assert replica is not None and replica.path == new


def test_a_model_with_a_replica_the_link_does_not_reach_is_left_to_serve_s_handle(
    sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sockets.mkdir(parents=True)
    here = sockets / f"{app_prefix('m')}here.sock"
    here.touch()
    now = [100.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: now[0])
    client = LinkClient(sockets, max_in_flight=4)
    client.refresh(["m"])
    client.saw("m", here.name)
    assert client.pick("m") is not None
    # Another node's replica: its socket is in that node's directory, not this one.
    client.saw("m", f"{app_prefix('m')}there.sock")
    assert client.pick("m") is None  # the link would leave it idle: every request by the handle
    assert client.card_calls("m") == 2
    for _ in range(int(KNOWN_FOR_S) + 1):  # it is gone (a downscale): its cards stop
        now[0] += 1.0
        client.saw("m", here.name)
        client.refresh(["m"])
    assert client.pick("m") is not None and client.card_calls("m") == 1
    client.saw("m", None)  # a replica with no socket is one the link does not reach either
    assert client.pick("m") is None
    client.saw("other", None)  # another model's replicas do not count
    now[0] += KNOWN_FOR_S + 0.1
    client.saw("m", here.name)
    assert client.pick("m") is not None


def test_no_directory_means_no_link() -> None:
    client = LinkClient(None, 4)
    client.refresh(["m"])
    assert client.pick("m") is None


def test_socket_paths_fit_a_unix_address_or_are_not_used() -> None:
    d = link_dir("0123456789abcdef" * 4, Path("/tmp/t"))
    assert d == Path("/tmp/t/0123456789abcdef")
    path = socket_path(d, "a-very-long-application-name" * 5, "r1")
    assert path is not None and path.name == f"{app_prefix('a-very-long-application-name' * 5)}r1.sock"
    assert app_prefix("m") != app_prefix("n")
    assert socket_path(Path("/tmp/" + "x" * 120), "m", "r1") is None


async def _double(n: Any) -> Any:
    return 2 * n


def test_sweeping_removes_only_sockets_nobody_listens_on(sockets: Path) -> None:
    import socket

    dead_node = sockets.parent / "dead"
    dead_node.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead_node / "x.sock"))
    s.close()

    async def scenario() -> None:
        live = LinkServer(sockets / "live.sock", _double)
        live.start()
        await asyncio.sleep(0.05)
        # a starting server sweeps: the dead one is gone, the live one stays
        assert not dead_node.exists() and (sockets / "live.sock").exists()
        late = socket.socket(socket.AF_UNIX)
        late.bind(str(sockets / "late.sock"))
        late.close()
        assert sweep_stale(sockets.parent) == 1  # by itself too, and only what refuses
        assert sorted(p.name for p in sockets.iterdir()) == ["live.sock"]
        await live.close(1.0)

    run(scenario())

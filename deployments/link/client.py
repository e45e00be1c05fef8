"""The router's end of the link: which local pipeline replica takes a request, and the call itself.

Each model application's pipeline replicas on this node listen on sockets in one directory, named by
the application and the replica. The router rescans it with the cards (every second), sends a request to
the local replica with the fewest of its requests in flight, and keeps at most ``max_in_flight`` there:
past that (or with no local replica: another node, a replica still starting) the request goes by Serve's
handle, whose replica choice and queue bounds then spread the load.

A socket is used only while its replica's card keeps coming by Serve's handle (``saw``): Serve stops routing
to a replica the moment it starts stopping it (a rollout, a downscale), while the replica itself keeps
listening through Serve's drain (30 s for an application's ingress behind HAProxy), so the socket alone
would keep a retired version in use.

And only while every replica of the model whose card came lately listens on this node: a replica on
another node (or one with no socket) is reached only by the handle, and sending this router's requests to
the local ones over the link would leave it idle while they queue. Serve's replica choice, by each
replica's queue, spreads them then.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.link.frames import LinkBroken, LinkReply, app_prefix, read_frame, write_frame

log = logging.getLogger("textserve.link")

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(eq=False)
class LocalReplica:
    path: Path
    in_flight: int = 0
    idle: list[Connection] = field(default_factory=list)
    gone: bool = False

    def close(self) -> None:
        self.gone = True
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


# How long a card from a replica keeps its socket in use: the router reads the cards every second.
SEEN_FOR_S = 3.5
# How long a card counts its replica among the model's, wherever it runs (it may be missed a few times).
KNOWN_FOR_S = 10.0
MAX_CARD_CALLS = 8
UNLINKED = ""  # the key of cards from replicas with no socket


class LinkClient:
    def __init__(self, directory: Path | None, max_in_flight: int) -> None:
        """``directory``: this node's sockets (None: no link, every call by the handle)."""
        self._dir = directory
        self.max_in_flight = max_in_flight
        self._replicas: dict[str, list[LocalReplica]] = {}
        self._seen: dict[str, dict[str, float]] = {}  # app -> socket name -> when its card last came

    def saw(self, app: str, socket_name: str | None) -> None:
        """A card of ``app`` came by Serve's handle from the replica listening on ``socket_name`` (any
        node; None: a replica with no socket)."""
        self._seen.setdefault(app, {})[socket_name or UNLINKED] = time.monotonic()

    def card_calls(self, app: str) -> int:
        """How many card calls to make at once, so that Serve's replica choice reaches each replica."""
        replicas = max(1, len(self._replicas.get(app, ())), len(self._known(app, KNOWN_FOR_S)))
        return min(MAX_CARD_CALLS, replicas)

    def _known(self, app: str, within_s: float) -> set[str]:
        since = time.monotonic() - within_s
        return {name for name, at in self._seen.get(app, {}).items() if at >= since}

    def refresh(self, apps: list[str]) -> None:
        """Reads which local replicas listen now; keeps the connections of those still there."""
        if self._dir is None:
            return
        try:
            names = sorted(os.listdir(self._dir))
        except OSError:  # no replica on this node has listened yet
            names = []
        for app in apps:
            prefix = app_prefix(app)
            known = {r.path.name: r for r in self._replicas.get(app, ()) if not r.gone}
            now = [
                known.pop(n, None) or LocalReplica(self._dir / n)
                for n in names
                if n.startswith(prefix) and n.endswith(".sock")
            ]
            for stale in known.values():
                stale.close()
            self._replicas[app] = now
            self._seen[app] = {n: self._seen[app][n] for n in self._known(app, KNOWN_FOR_S)}

    def pick(self, app: str) -> LocalReplica | None:
        """The local replica with the fewest of this router's requests, under the cap; None: the handle."""
        local = self._replicas.get(app, ())
        if not self._known(app, KNOWN_FOR_S) <= {r.path.name for r in local}:
            return None  # the model has replicas the link does not reach: Serve balances over all of them
        carded = self._known(app, SEEN_FOR_S)
        live = [r for r in local if not r.gone and r.in_flight < self.max_in_flight and r.path.name in carded]
        return min(live, key=lambda r: r.in_flight) if live else None

    async def try_call(self, app: str, request: Any) -> LinkReply | None:
        """The reply of a local replica of ``app`` (a link key); None when none takes the request: the caller
        sends it by Serve's handle."""
        replica = self.pick(app)
        return None if replica is None else await self.call(replica, request)

    async def call(self, replica: LocalReplica, request: Any) -> LinkReply | None:
        """The pipeline's reply; None when the request did not reach a live pipeline (nothing ran: the
        caller sends it by the handle). Raises ``LinkBroken`` when the replica died with it."""
        replica.in_flight += 1
        connection: Connection | None = None
        try:
            connection = await self._connect(replica)
            if connection is None:
                return None
            reader, writer = connection
            write_frame(writer, request)
            try:
                reply = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                writer.close()
                connection = None
                raise LinkBroken(f"the pipeline replica at {replica.path.name} closed the link") from exc
            if reply.refused:  # shutting down: it runs nothing new
                replica.close()
                return None
            replica.idle.append(connection)
            connection = None
            return reply
        finally:
            replica.in_flight -= 1
            if connection is not None:  # cancelled mid-call: closing tells the replica to drop the request
                connection[1].close()

    async def _connect(self, replica: LocalReplica) -> Connection | None:
        while replica.idle:
            reader, writer = replica.idle.pop()
            if not (reader.at_eof() or writer.is_closing()):
                return reader, writer
            writer.close()
        if replica.gone:
            return None
        try:
            return await asyncio.open_unix_connection(str(replica.path))
        except OSError as exc:
            replica.gone = True  # exited or never listened: the next rescan drops it
            if exc.errno == errno.ECONNREFUSED:  # a socket file nobody listens on: a replica that crashed
                replica.path.unlink(missing_ok=True)
            log.info("link: %s not reachable (%r); by the handle", replica.path.name, exc)
            return None

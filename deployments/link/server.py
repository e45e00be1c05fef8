"""The pipeline replica's end of the link: a Unix socket server that runs each request through the same
``Model.run`` that Serve's handle calls.

Serve's handle between two replicas wakes several gRPC threads per call; a Unix socket read by the replica's
own event loop costs a fraction of that (docs/architecture.md, "The paths a request can take"). Serve does
not count these requests as the replica's ongoing ones. The router stops sending here once Serve stops
routing to this replica (its cards stop coming: ``client.py``); if Serve calls ``__del__`` in time, the
replica also refuses new link requests there (the router sends them by the handle) and waits for those in
flight before it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.exceptions import RayServeException

from deployments.link.frames import (
    LinkReply,
    link_key,
    make_private_dir,
    read_frame,
    socket_path,
    sweep_stale,
    this_node_dir,
    write_frame,
)

log = logging.getLogger("textserve.link")

# How long a stopping replica waits for the requests its link brought (Serve waits only for its own), within
# Serve's graceful_shutdown_timeout_s (20 s unless a deployment sets it).
LINK_DRAIN_S = 15.0

Handler = Callable[[Any], Awaitable[Any]]


class LinkServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closing = False
        self._in_flight = 0
        self._idle = asyncio.Event()

    @classmethod
    def for_replica(cls, handler: Handler, by_deployment: bool = False) -> LinkServer | None:
        """The server of the Serve replica this runs in; None outside one (a unit test). ``by_deployment``:
        named by application and deployment (a deployment other than the application's ingress)."""
        try:
            context = serve.get_replica_context()
        except RayServeException:
            return None
        key = link_key(context.app_name, context.deployment if by_deployment else None)
        path = socket_path(this_node_dir(), key, context.replica_id.unique_id)
        return cls(path, handler) if path is not None else None

    def start(self) -> None:
        """Listen from the running event loop (the replica's), once; a failure leaves the handle path.
        Called again from the replica's ``ready()``, in case its constructor ran outside the loop."""
        if self._starting is None and not self._closing:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._starting = loop.create_task(self._listen())

    async def _listen(self) -> None:
        try:
            sweep_stale(self.path.parent.parent)
            make_private_dir(self.path.parent)
            self.path.unlink(missing_ok=True)  # a previous replica's, with this one's name: none can be live
            self._server = await asyncio.start_unix_server(self._connection, str(self.path))
            self.path.chmod(0o600)
            log.info("link: listening on %s", self.path)
        except OSError as exc:
            log.warning("link: not listening (%r); the router calls this replica by Serve's handle", exc)

    async def close(self, timeout_s: float) -> None:
        """Refuse new requests, stop listening, and wait (at most ``timeout_s``) for those in flight."""
        self._closing = True
        if self._starting is not None:
            with contextlib.suppress(BaseException):
                await self._starting
        if self._server is not None:
            self._server.close()
        self.path.unlink(missing_ok=True)
        if self._in_flight:
            self._idle.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await read_frame(reader)
                if self._closing:
                    write_frame(writer, LinkReply(refused=True))
                    continue
                reply = await self._one(request, reader)
                if reply is None:  # the router hung up: its client left or the deadline passed
                    return
                write_frame(writer, reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the router closed the connection between requests
        except Exception:
            log.exception("link: dropping a connection")
        finally:
            writer.close()

    async def _one(self, request: Any, reader: asyncio.StreamReader) -> LinkReply | None:
        """Runs one request while watching the connection: the router sends nothing more before the reply,
        so a read that ends means it hung up, and the request is cancelled (it then costs no model time)."""
        self._in_flight += 1
        run = asyncio.ensure_future(self._handler(request))
        hangup = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({run, hangup}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
                return None
            try:
                return LinkReply(answer=run.result())
            except Exception as exc:
                log.exception("link: the pipeline raised instead of answering", exc_info=exc)
                return LinkReply(error=f"{type(exc).__name__}: {exc}")
        finally:
            # Nothing outlives the request, and the watch on the connection has ended before the next
            # read: a stream takes one reader at a time.
            pending = [t for t in (run, hangup) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            self._in_flight -= 1
            if self._closing and self._in_flight == 0:
                self._idle.set()

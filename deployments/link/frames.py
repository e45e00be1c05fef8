"""What crosses the link, and where its sockets live.

A frame is a 4-byte little-endian length, then a pickle. The router sends a ``ModelRequest`` and, on the
same connection, nothing else until the reply: a ``LinkReply``. Pickle is safe here for the same reason
Ray's own transport is: the socket's directory is readable by this user only (0700), so only the
processes that already run this service's code can connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pickle
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

_HEADER = 4
# sun_path holds 108 bytes with its terminating NUL.
_MAX_SOCKET_PATH = 107
MAX_FRAME_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class LinkReply:
    """The pipeline's answer to one request. ``refused``: the replica is shutting down and did not run it
    (the router sends it by Serve's handle instead). ``error``: the pipeline raised where it should have
    answered (the router reports an internal error, as for a stage that failed as a whole)."""

    answer: Any = None
    refused: bool = False
    error: str | None = None

    def result(self) -> Any:
        """The answer; a pipeline that raised is an internal error of the caller's (as a stage that failed
        as a whole)."""
        if self.error is not None:
            raise RuntimeError(f"the replica raised: {self.error}")
        return self.answer


def link_dir(node_id: str, root: Path | None = None) -> Path:
    """This user's sockets on this Ray node (a second Ray cluster on the host has another node id)."""
    base = root if root is not None else Path(tempfile.gettempdir()) / f"textserve-{os.getuid()}"
    return base / node_id[:16]


def this_node_dir() -> Path:
    """The link directory of the Ray node this process runs on."""
    return link_dir(ray.get_runtime_context().get_node_id())


def link_key(app: str, deployment: str | None = None) -> str:
    """What a link's sockets are named by: the application for its ingress (``Model``, which the router
    calls), the application and deployment for a deployment inside it (``Inference``: ``Model`` calls it)."""
    return app if deployment is None else f"{app}/{deployment}"


def app_prefix(app: str) -> str:
    """A link key's socket names start with this (a hash: application names may be long)."""
    return hashlib.sha1(app.encode(), usedforsecurity=False).hexdigest()[:12] + "-"


def socket_path(directory: Path, app: str, replica: str) -> Path | None:
    """Where one pipeline replica listens; None when the path would not fit a Unix socket address."""
    path = directory / f"{app_prefix(app)}{replica}.sock"
    return path if len(os.fsencode(path)) <= _MAX_SOCKET_PATH else None


def make_private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.parent.chmod(0o700)


def sweep_stale(base: Path) -> int:
    """Removes the sockets under ``base`` that nobody listens on (replicas killed without a shutdown,
    clusters stopped with ``ray stop --force``), and the node directories they leave empty."""
    removed = 0
    for node in base.iterdir() if base.is_dir() else ():
        for path in node.glob("*.sock"):
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(path))
                except ConnectionRefusedError:
                    path.unlink(missing_ok=True)
                    removed += 1
                except OSError:
                    pass
        with contextlib.suppress(OSError):
            node.rmdir()  # only when empty
    return removed


def write_frame(writer: asyncio.StreamWriter, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(len(data).to_bytes(_HEADER, "little") + data)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """Raises ``asyncio.IncompleteReadError`` when the other side closed the connection."""
    size = int.from_bytes(await reader.readexactly(_HEADER), "little")
    if size > MAX_FRAME_BYTES:
        raise ConnectionError(f"link frame of {size} bytes is over the limit")
    return pickle.loads(await reader.readexactly(size))


class LinkBroken(ConnectionError):
    """The replica's end closed after the request was sent (it died with the request in it)."""

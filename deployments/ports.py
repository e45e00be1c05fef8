"""Who holds a TCP port: the preflight's check that ``serve run`` can listen where the config says.

In the high-throughput mode HAProxy listens on the HTTP port (and on its stats and metrics ports). It is a
child process of Ray's HAProxyManager actor and does not die with it: when ``serve run`` is killed hard
(SIGKILL, SIGTERM, a closed terminal) rather than stopped with Ctrl-C, the HAProxy stays and keeps the
ports, and the next ``serve run`` cannot start its own. The preflight names such a process instead of
letting Serve retry in its logs. Linux only (``/proc``); elsewhere a held port is reported without its holder.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path

PROC = Path("/proc")
HAPROXY_MANAGER = "ray::HAProxyManager"
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


@dataclass(frozen=True)
class PortHolder:
    """A process listening on ports, and whether it is an HAProxy whose Ray instance is gone."""

    ports: tuple[int, ...]
    pid: int | None
    program: str
    orphaned_haproxy: bool

    def describe(self) -> str:
        ports = ", ".join(map(str, self.ports))
        where = f"port{'s' if len(self.ports) > 1 else ''} {ports}"
        if self.pid is None:
            return f"{where} in use (the process could not be found)"
        what = f"{where} held by pid {self.pid} ({self.program})"
        if self.orphaned_haproxy:
            return (
                f"{what}: an HAProxy left behind by a Ray Serve instance that is no longer running "
                f"(stopped without Ctrl-C); stop it with `kill {self.pid}`"
            )
        return what


def is_free(host: str, port: int) -> bool:
    """Whether a listening socket can be bound to ``host:port`` now (as Serve's listeners will)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _cmdline(pid: int) -> str:
    try:
        return (
            (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        )
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _owner(inodes: set[str]) -> int | None:
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(entry.name)
        except OSError:
            continue
    return None


def is_orphaned_haproxy(command: str, parent_command: str) -> bool:
    """An HAProxy whose parent is not Ray's HAProxyManager actor any more (re-parented when it died)."""
    program = command.split(" ", 1)[0]
    return program.rsplit("/", 1)[-1] == "haproxy" and not parent_command.startswith(HAPROXY_MANAGER)


def holder(host: str, port: int) -> PortHolder | None:
    """None when ``host:port`` is free; otherwise the process listening there, as far as ``/proc`` tells."""
    if is_free(host, port):
        return None
    pid = _owner(_listening_inodes(port))
    if pid is None:
        return PortHolder((port,), None, "", orphaned_haproxy=False)
    command = _cmdline(pid)
    orphaned = is_orphaned_haproxy(command, _cmdline(_parent(pid)))
    return PortHolder((port,), pid, command.split(" ", 1)[0], orphaned_haproxy=orphaned)


def holders(addresses: list[tuple[str, int]]) -> list[PortHolder]:
    """The busy ones of ``addresses``, one entry per process (HAProxy holds three ports at once)."""
    by_pid: dict[int, PortHolder] = {}
    for host, port in addresses:
        h = holder(host, port)
        if h is None:
            continue
        seen = by_pid.get(h.pid) if h.pid is not None else None
        key = h.pid if h.pid is not None else -port
        by_pid[key] = replace(seen, ports=seen.ports + h.ports) if seen else h
    return list(by_pid.values())

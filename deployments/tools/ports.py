"""Who holds a TCP port: the preflight's check that ``serve run`` can listen where the config says.

In the high-throughput mode HAProxy listens on the HTTP port (and on its stats and metrics ports). It is a
child process of Ray's HAProxyManager actor and does not die with it: when ``serve run`` is killed hard
(SIGKILL, SIGTERM, `ray stop --force`) rather than stopped with Ctrl-C, the HAProxy stays and keeps the
ports, and the next ``serve run`` cannot start its own. The preflight names such a process instead of
letting Serve retry in its logs. Where the holder cannot be seen (another user's process on some systems),
the port is reported as in use without it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

import psutil

HAPROXY_MANAGER = "ray::HAProxyManager"


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


def _listener(port: int) -> int | None:
    """The pid listening on ``port`` (any address), if this user may see it."""
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.Error:
        return None
    return next(
        (c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid), None
    )


def _command(proc: psutil.Process | None) -> str:
    try:
        return " ".join(proc.cmdline()).strip() if proc is not None else ""
    except psutil.Error:
        return ""


def is_orphaned_haproxy(command: str, parent_command: str) -> bool:
    """An HAProxy whose parent is not Ray's HAProxyManager actor any more (re-parented when it died)."""
    program = command.split(" ", 1)[0]
    return program.rsplit("/", 1)[-1] == "haproxy" and not parent_command.startswith(HAPROXY_MANAGER)


def holder(host: str, port: int) -> PortHolder | None:
    """None when ``host:port`` is free; otherwise the process listening there, as far as this user can see."""
    if is_free(host, port):
        return None
    pid = _listener(port)
    if pid is None:
        return PortHolder((port,), None, "", orphaned_haproxy=False)
    try:
        proc = psutil.Process(pid)
        parent = proc.parent()
    except psutil.Error:
        proc = parent = None
    command = _command(proc)
    orphaned = is_orphaned_haproxy(command, _command(parent))
    return PortHolder((port,), pid, command.split(" ", 1)[0], orphaned_haproxy=orphaned)


def holders(addresses: list[tuple[str, int]]) -> list[PortHolder]:
    """The busy ones of ``addresses``, one entry per process (HAProxy holds three ports at once)."""
    by_pid: dict[int, PortHolder] = {}
    unknown: list[PortHolder] = []
    for host, port in addresses:
        h = holder(host, port)
        if h is None:
            continue
        if h.pid is None:
            unknown.append(h)
        elif h.pid in by_pid:
            by_pid[h.pid] = replace(by_pid[h.pid], ports=by_pid[h.pid].ports + h.ports)
        else:
            by_pid[h.pid] = h
    return [*by_pid.values(), *unknown]

"""Starting and stopping the servers under test: own process groups, free ports, no stray processes.

Every server runs in a new session (``start_new_session``), so stopping it signals its whole process
group; whatever escaped the group (Ray daemons, for instance) is found by its session id or by a
marker string in its command line (a unique temp directory) and stopped too. Nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from deployments.tools.ports import is_free


class StartError(RuntimeError):
    """A server under test did not come up; the message says why (and where its log is)."""


# Ports are picked from below the kernel's ephemeral range: a port from bind(0) lies inside it, where any
# process may take it again (an outgoing connection, a Ray gRPC server on port 0) before the server under
# test binds it. That happened: HAProxy's stats port, picked that way, was taken during a service's start.
# The floor stays above Ray's worker ports (10002-19999 by default).
PICK_FLOOR = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()  # not reserved by the kernel: never hand the same port out twice


def ephemeral_floor() -> int:
    """The lowest port the kernel hands out on its own (Linux; 32768, its default, elsewhere)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free now on every interface, below the ephemeral range, not handed out before."""
    high = ephemeral_floor()
    for _ in range(1000) if high - PICK_FLOOR >= 1000 else ():
        port = random.randrange(PICK_FLOOR, high)
        if port not in _handed_out and is_free("0.0.0.0", port):  # any address, as HAProxy's stats bind
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # a narrow or odd port range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    cmd: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    pass_fds: Sequence[int] = (),
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session with stdout and stderr going to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            env=env,
            cwd=cwd,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone meanwhile
        return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def find_leftovers(session_id: int, markers: Iterable[str] = ()) -> list[int]:
    """Live processes in session ``session_id`` or whose command line contains a marker."""
    markers = [m for m in markers if m]
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me or not _alive(pid):
            continue
        if _session_of(pid) == session_id or (markers and any(m in cmdline(pid) for m in markers)):
            found.append(pid)
    return found


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0, markers: Iterable[str] = ()) -> list[int]:
    """Stop ``proc``'s process group (TERM, then KILL after ``grace_s``), then any leftovers.

    Returns the pids that had to be killed as leftovers (for the log)."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group and session id
    if proc.poll() is None:
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait(timeout=10)
    _signal_group(pgid, signal.SIGTERM)  # children still in the group after the leader left
    markers = list(markers)
    leftovers = find_leftovers(pgid, markers)
    deadline = time.monotonic() + grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.2)
            leftovers = [p for p in leftovers if _alive(p)]
        if not leftovers:
            break
        deadline = time.monotonic() + 5.0
    return find_leftovers(pgid, markers)


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None, log: Path) -> float:
    """Poll ``url`` until it answers 200; return the seconds it took. Fails early if ``proc`` exits."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if http_ok(url):
            return time.monotonic() - t0
        if proc is not None and proc.poll() is not None:
            raise StartError(
                f"exited with code {proc.returncode} before {url} answered; log: {log}\n{tail(log)}"
            )
        time.sleep(0.5)
    raise StartError(f"{url} did not answer 200 within {timeout_s:.0f} s; log: {log}\n{tail(log)}")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

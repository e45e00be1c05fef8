"""Process bookkeeping that the benchmark and the direct-ingress test use to find and stop a server."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from bench import procs


def test_find_leftovers_finds_the_processes_of_a_session() -> None:
    # A session leader with a grandchild that stays in its session: what a Ray instance's processes look like.
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    )
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        found: list[int] = []
        for _ in range(50):
            found = procs.find_leftovers(leader.pid)
            if len(found) >= 2:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert leader.pid in found and len(found) == 2, found
        assert all("time.sleep(30)" in procs.cmdline(p) for p in found)
        assert procs.find_leftovers(leader.pid + 10_000_000) == []  # no such session
    finally:
        assert procs.stop(leader, grace_s=5.0) == []
    assert procs.find_leftovers(leader.pid) == []


def test_free_ports_come_from_below_the_ephemeral_range_and_are_never_repeated() -> None:
    floor = procs.ephemeral_floor()
    assert floor >= procs.PICK_FLOOR + 1000  # this machine's range leaves room below it
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(procs.PICK_FLOOR <= p < floor for p in ports), ports
    # Free on every interface, as HAProxy's stats listener binds.
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))


def test_a_port_held_on_loopback_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", procs.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        # Every random pick lands on the held port first, then on one that is free.
        picks = iter([taken, taken, taken + 1])
        monkeypatch.setattr(procs.random, "randrange", lambda lo, hi: next(picks))
        procs._handed_out.discard(taken + 1)
        assert procs.free_port() == taken + 1

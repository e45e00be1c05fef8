"""Process bookkeeping that the benchmark and the direct-ingress test use to find and stop a server."""

from __future__ import annotations

import subprocess
import sys

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

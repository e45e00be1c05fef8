"""A model set up on a passing thread leaves no OpenMP pool behind (runtime/openmp.py); the premise is checked
in a child process, whose OpenMP state is fresh."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from deployments.runtime.openmp import on_passing_thread

# Parallel work on a passing thread, then on the main thread (which lives on): the OS threads each time.
CHILD = """
import json, os, time, torch
from deployments.runtime.openmp import on_passing_thread
def thread_count():
    return len(os.listdir('/proc/self/task'))
torch.set_num_threads(2)
x = torch.randn(1024, 1024)
def work():
    return float((x @ x).exp().sum())
def settled():  # a pool's workers leave shortly after their thread ends
    for _ in range(100):
        n = thread_count()
        time.sleep(0.02)
        if thread_count() == n:
            return n
    return thread_count()
base = settled()
on_passing_thread(work)
after_passing = settled()
work()
after_main = settled()
print(json.dumps({"base": base, "after_passing": after_passing, "after_main": after_main,
                  "openmp": "OpenMP" in torch.__config__.parallel_info()}))
"""


def test_returns_the_result_from_a_thread_that_has_ended():
    seen: list[threading.Thread] = []

    def fn() -> int:
        seen.append(threading.current_thread())
        return 42

    assert on_passing_thread(fn) == 42
    assert seen[0] is not threading.current_thread()
    assert not seen[0].is_alive()


def test_raises_the_functions_exception_on_the_callers_thread():
    def fn() -> None:
        raise KeyError("no such weight")

    with pytest.raises(KeyError, match="no such weight"):
        on_passing_thread(fn)


def test_a_passing_threads_pool_ends_with_it_and_a_live_threads_pool_stays():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["openmp"], "this torch build does not run on OpenMP: the module's premise needs a re-check"
    assert seen["base"] > 0
    assert seen["after_passing"] == seen["base"]  # the passing thread and its pool's worker are gone
    assert seen["after_main"] > seen["base"]  # the main thread's pool keeps its worker

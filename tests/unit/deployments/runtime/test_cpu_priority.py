"""A bulk replica's threads, existing and later ones, run at the lowered CPU priority (in a child process:
niceness cannot be raised back)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, os, threading
from deployments.runtime.cpu_priority import lower_cpu_priority
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()
base = os.getpriority(os.PRIO_PROCESS, 0)
target = min(19, base + 2)
changed = lower_cpu_priority(target)
seen = {}
def later():
    seen["later"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
t = threading.Thread(target=later)
t.start(); t.join()
seen["main"] = os.getpriority(os.PRIO_PROCESS, 0)
seen["before"] = os.getpriority(os.PRIO_PROCESS, before.native_id)
seen["changed"] = changed
seen["base"], seen["target"] = base, target
seen["again"] = lower_cpu_priority(base)  # never raised back
print(json.dumps(seen))
"""


def test_every_thread_now_and_later_runs_lowered_and_it_is_never_raised_back():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["base"] < 19, "the test process already runs at the lowest priority: nothing to show"
    assert seen["main"] == seen["before"] == seen["later"] == seen["target"]
    assert seen["changed"] >= 2 and seen["again"] == 0


IDLE_CHILD = """
import json, os, threading
from deployments.runtime.cpu_priority import lower_cpu_priority
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()
changed = lower_cpu_priority("idle")
seen = {}
def later():
    tid = threading.get_native_id()
    seen["later"] = [os.sched_getscheduler(tid) == os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, tid)]
t = threading.Thread(target=later)
t.start(); t.join()
seen["main"] = [os.sched_getscheduler(0) == os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, 0)]
seen["before"] = [os.sched_getscheduler(before.native_id) == os.SCHED_IDLE,
                  os.getpriority(os.PRIO_PROCESS, before.native_id)]
seen["changed"] = changed
seen["again"] = lower_cpu_priority("idle")  # already there: nothing changes
print(json.dumps(seen))
"""


def test_idle_puts_every_thread_now_and_later_in_sched_idle_at_nice_19():
    out = subprocess.run([sys.executable, "-c", IDLE_CHILD], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["main"] == seen["before"] == seen["later"] == [True, 19]
    assert seen["changed"] >= 2 and seen["again"] == 0

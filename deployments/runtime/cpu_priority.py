"""A replica's CPU priority under contention (Linux niceness, or the SCHED_IDLE class), for a CPU model's
bulk work.

Niceness and the scheduling class are per thread on Linux, and a new thread inherits its creator's: every
thread the process has is lowered, so the threads made later (the model's intra-op pool, Ray's) start lowered
too. Lowering needs no privilege; this never raises a thread back.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

log = logging.getLogger("textserve.runtime")

IDLE = "idle"
BulkNice = int | Literal["idle"]  # runtime.bulk_nice: 0 (off), a niceness, or "idle"


def lower_cpu_priority(nice: BulkNice) -> int:
    """Set every thread of this process to at least ``nice``; ``"idle"``: nice 19 and Linux's SCHED_IDLE
    class (the thread runs only when its core has nothing else to run). Returns how many threads changed."""
    idle = nice == IDLE
    level = 19 if idle else int(nice)
    changed = 0
    for task in Path("/proc/self/task").iterdir() if Path("/proc/self/task").is_dir() else ():
        tid = int(task.name)
        try:
            lowered = os.getpriority(os.PRIO_PROCESS, tid) < level
            if lowered:
                os.setpriority(os.PRIO_PROCESS, tid, level)
            if idle and os.sched_getscheduler(tid) != os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                lowered = True
            changed += lowered
        except OSError:  # the thread ended meanwhile, or a sandbox forbids it: keep the default priority
            continue
    log.info("CPU priority lowered to %s for %d threads", "SCHED_IDLE" if idle else f"nice {level}", changed)
    return changed

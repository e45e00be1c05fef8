"""A replica's CPU priority under contention (Linux niceness), for a CPU model's bulk work.

Niceness is per thread on Linux, and a new thread inherits its creator's: every thread the process has is
lowered, so the threads made later (the model's intra-op pool, Ray's) start lowered too. Raising niceness
needs no privilege, lowering it back does: this only ever raises it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("textserve.runtime")


def lower_cpu_priority(nice: int) -> int:
    """Set every thread of this process to at least ``nice``; returns how many threads changed."""
    changed = 0
    for task in Path("/proc/self/task").iterdir() if Path("/proc/self/task").is_dir() else ():
        tid = int(task.name)
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except OSError:  # the thread ended meanwhile, or a sandbox forbids it: keep the default priority
            continue
    log.info("CPU priority lowered to nice %d for %d threads", nice, changed)
    return changed

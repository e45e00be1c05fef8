"""What the run ran on: CPUs, memory, software versions, and other load on the machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

PACKAGES = ("ray", "torch", "transformers", "onnxruntime-gpu", "onnxruntime", "tokenizers", "aiohttp")


# Instruction sets that decide how fast a model's matrix products run (bf16, int8, AMX tiles).
MATMUL_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def _cpu_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_model(cpuinfo: str) -> str:
    """The model name, with family/model and the matmul instruction sets: a VM's "AMD EPYC" names no
    generation, and two hosts behind that name ran the same model's pass 1.4-1.6 times apart."""
    fields = _cpu_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or "unknown"
    detail = []
    if "cpu family" in fields and "model" in fields:
        detail.append(f"family {fields['cpu family']} model {fields['model']}")
    flags = set(fields.get("flags", "").split())
    detail += [flag for flag in MATMUL_FLAGS if flag in flags]
    return f"{name} ({', '.join(detail)})" if detail else name


def mem_total_gib(meminfo: str) -> float | None:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def versions(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    out.update(extra or {})
    return out


def git_revision(root: Path) -> str:
    """``<commit>`` or ``<commit>+dirty`` of the checkout measured ("unknown" outside git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine_info(extra_versions: dict[str, str] | None = None, root: Path | None = None) -> dict[str, Any]:
    vers = versions(extra_versions)
    return {
        "git": git_revision(root) if root else "unknown",
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(_read("/proc/cpuinfo")),
        "ram_gib": mem_total_gib(_read("/proc/meminfo")),
        "kernel": platform.release(),
        "versions": ", ".join(f"{k} {v}" for k, v in vers.items()),
        "loadavg_at_start": _read("/proc/loadavg").split()[:3],
    }


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [int(x) for x in _read("/proc/stat").splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all CPUs busy between two ``cpu_times()`` samples."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def background_load(seconds: float = 2.0) -> float:
    """Share of all CPUs busy over ``seconds`` while this process sleeps: other load on the machine."""
    before = cpu_times()
    time.sleep(seconds)
    return busy_fraction(before, cpu_times())


def wait_quiet(threshold: float = 0.25, max_wait_s: float = 30.0, sample_s: float = 2.0) -> float:
    """Wait (bounded) until other load falls below ``threshold`` (e.g. a stopped server winding down);
    returns the last measured share of busy CPUs."""
    deadline = time.monotonic() + max_wait_s
    load = background_load(sample_s)
    while load > threshold and time.monotonic() < deadline:
        load = background_load(sample_s)
    return load


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, session id, CPU jiffies used so far) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            # After the command: state ppid pgrp session ... utime(12th) stime(13th)
            table[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12]))
    return table


def descendants(table: dict[int, tuple[int, int, int]], root: int) -> set[int]:
    found = {root}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _, _) in table.items() if ppid in found and pid not in found}
        found |= new
        grew = bool(new)
    return found


class OtherLoadProbe:
    """CPU used during a window by processes that are neither the system under test (its session)
    nor the load generator (this process and its children), as a share of all CPUs."""

    def __init__(self, server_session: int | None) -> None:
        self.server_session = server_session
        self._start: tuple[tuple[int, int], dict[int, int]] | None = None

    def _ours(self) -> dict[int, int]:
        table = process_table()
        client = descendants(table, os.getpid())
        return {
            pid: jiffies
            for pid, (_, sid, jiffies) in table.items()
            if pid in client or (self.server_session is not None and sid == self.server_session)
        }

    def start(self) -> None:
        self._start = (cpu_times(), self._ours())

    def stop(self) -> float | None:
        if self._start is None:
            return None
        (busy0, total0), ours0 = self._start
        busy1, total1 = cpu_times()
        ours1 = self._ours()
        ours = sum(j - ours0.get(pid, 0) for pid, j in ours1.items())
        total = total1 - total0
        return max(0.0, (busy1 - busy0 - ours) / total) if total > 0 else None


def wait_for_quiet(
    server_session: int | None, threshold: float, max_wait_s: float = 60.0, sample_s: float = 2.0
) -> float | None:
    """Sleep (bounded) until other processes use at most ``threshold`` of the CPUs over ``sample_s``;
    the server under test and this process do not count. Returns the last sample."""
    deadline = time.monotonic() + max_wait_s
    while True:
        probe = OtherLoadProbe(server_session)
        probe.start()
        time.sleep(sample_s)
        load = probe.stop()
        if load is None or load <= threshold or time.monotonic() >= deadline:
            return load

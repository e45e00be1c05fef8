"""What the soaks watch in the replicas: their process ids (asked of the replica actors) and their memory
over a run (RSS samples, and whether it kept growing)."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from typing import Any

import psutil

from tests.integration.conftest import APP, DEFAULT_MODEL

MB = 2**20
# A soak's client timeout, above the service's 30 s deadline: a hang is a failure there, not a stuck test.
CLIENT_TIMEOUT_S = 45.0
# A replica's memory "kept growing" when its last third's median RSS passes its first third's by both.
RSS_GROWTH_RATIO = 0.15
RSS_GROWTH_BYTES = 50 * MB


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def inference_stats() -> dict[str, Any]:
    from ray import serve

    return (
        serve.get_deployment_handle("Inference", app_name=DEFAULT_MODEL)
        .batching.remote()
        .result(timeout_s=30)
    )


def inference_pid() -> int:
    return int(inference_stats()["pid"])


def ingress_pid() -> int:
    return replica_pid(APP, "Ingress")


def replica_pid(app: str, deployment: str) -> int:
    """A replica's process id, asked of the replica actor itself (found in Serve's namespace)."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "serve" and a["name"].startswith(prefix)
    ]
    assert len(names) == 1, names
    actor = ray.get_actor(names[0], namespace="serve")
    return int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30))


class RssSampler:
    def __init__(self, pids: dict[str, int], interval_s: float, max_samples: int) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._interval_s = interval_s
        self._max_samples = max_samples
        self._stop = threading.Event()
        self.samples: dict[str, list[tuple[float, int]]] = {name: [] for name in pids}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        for _ in range(self._max_samples):
            now = time.monotonic() - self._t0
            for name, proc in self._procs.items():
                # A vanished process shows as missing samples; the pid check catches a restart.
                with contextlib.suppress(psutil.Error):
                    self.samples[name].append((now, proc.memory_info().rss))
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def growth(series: list[tuple[float, int]], warmup_s: float) -> tuple[float, float, int, int]:
    """(bytes, ratio, first-third median, last-third median) of the post-warm-up samples."""
    values = [rss for t, rss in series if t >= warmup_s]
    assert len(values) >= 6, f"too few samples after warm-up: {len(values)}"
    third = len(values) // 3
    first, last = statistics.median(values[:third]), statistics.median(values[-third:])
    return last - first, (last - first) / first, int(first), int(last)


def rss_summary(name: str, series: list[tuple[float, int]], warmup_s: float) -> str:
    values = [rss / MB for _, rss in series]
    grew, ratio, first, last = growth(series, warmup_s)
    compact = " ".join(f"{t:.0f}s:{rss / MB:.0f}" for t, rss in series[:: max(1, len(series) // 12)])
    return (
        f"{name} RSS: {len(values)} samples, min {min(values):.0f} MB, "
        f"median {statistics.median(values):.0f} MB, max {max(values):.0f} MB; "
        f"after {warmup_s:.0f} s warm-up, first-third median {first / MB:.1f} MB -> "
        f"last-third median {last / MB:.1f} MB: {grew / MB:+.1f} MB ({ratio * 100:+.1f} %)\n"
        f"  series (MB): {compact}"
    )

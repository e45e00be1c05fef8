"""Closed-loop HTTP load: N workers, each sends its next request as soon as the last one answered.

One aiohttp event loop per client process, request bodies encoded once up front, and responses checked
without parsing (status 200 and one ``"embedding":`` key per input), so the client stays light on the
CPU it shares with the server. The client's own CPU time over the window is measured and reported.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.machine import OtherLoadProbe
from bench.results import Point, summarize

EMBEDDING_KEY = b'"embedding":'  # the key; ``"object": "embedding"`` has the same word as a value


@dataclass(frozen=True)
class Target:
    """Where to send embedding requests: the full URL of an OpenAI-compatible route."""

    url: str
    model: str
    encoding_format: str = "float"


@dataclass(frozen=True)
class Timing:
    warmup_s: float
    duration_s: float
    request_timeout_s: float = 60.0


@dataclass(frozen=True)
class Requests:
    """Pre-encoded request bodies and how many embeddings each must return."""

    bodies: tuple[bytes, ...]
    counts: tuple[int, ...]
    texts_per_request: int
    result_key: bytes = EMBEDDING_KEY  # counted in each answer: one per embedding (or rerank result)


def encode_requests(target: Target, groups: Sequence[Sequence[str]]) -> Requests:
    """One body per group of texts; a group of one is sent as a plain string, as most clients do."""
    bodies = []
    for group in groups:
        payload = {
            "input": group[0] if len(group) == 1 else list(group),
            "model": target.model,
            "encoding_format": target.encoding_format,
        }
        bodies.append(json.dumps(payload).encode())
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of unequal size: {sorted(sizes)}")
    return Requests(tuple(bodies), tuple(len(g) for g in groups), sizes.pop())


@dataclass
class RawSamples:
    latencies_s: list[float]
    errors: int
    error_examples: list[str]
    client_cpu: float


async def _closed_loop(
    target: Target,
    requests: Requests,
    concurrency: int,
    timing: Timing,
    start_at: float,
    offset: int,
) -> RawSamples:
    window_start = start_at + timing.warmup_s
    window_end = window_start + timing.duration_s
    latencies: list[float] = []
    errors = 0
    examples: list[str] = []
    cpu_marks: list[float] = []
    counter = iter(range(offset, offset + 10**9))
    n_bodies = len(requests.bodies)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.monotonic()) < window_end:
            i = next(counter) % n_bodies
            ok, problem = False, ""
            try:
                async with session.post(target.url, data=requests.bodies[i]) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        problem = f"HTTP {resp.status}: {body[:200]!r}"
                    elif body.count(requests.result_key) != requests.counts[i]:
                        problem = f"expected {requests.counts[i]} results: {body[:200]!r}"
                    else:
                        ok = True
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            done = time.monotonic()
            if window_start <= done <= window_end:
                if ok:
                    latencies.append(done - sent)
                else:
                    errors += 1
            if problem and len(examples) < 5:
                examples.append(problem)
            if not ok and done - sent < 0.01:
                await asyncio.sleep(0.05)  # a server that fails fast must not turn this into a busy loop

    async def cpu_meter() -> None:
        await asyncio.sleep(max(0.0, window_start - time.monotonic()))
        cpu_marks.append(time.process_time())
        await asyncio.sleep(max(0.0, window_end - time.monotonic()))
        cpu_marks.append(time.process_time())

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    client_timeout = aiohttp.ClientTimeout(total=timing.request_timeout_s)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout, headers=headers) as session:
        tasks = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
        meter = asyncio.create_task(cpu_meter())
        # Bounded: each worker stops sending at window_end; in-flight requests end by their timeout.
        await asyncio.wait_for(
            asyncio.gather(*tasks, meter),
            timeout=timing.warmup_s + timing.duration_s + timing.request_timeout_s + 30,
        )
    cpu = (cpu_marks[1] - cpu_marks[0]) / timing.duration_s if len(cpu_marks) == 2 else 0.0
    return RawSamples(latencies, errors, examples, cpu)


def _run_in_process(args: tuple[Target, Requests, int, Timing, float, int]) -> RawSamples:
    return asyncio.run(_closed_loop(*args))


def split_concurrency(concurrency: int, processes: int) -> list[int]:
    """Spread ``concurrency`` workers over at most ``processes`` processes, none empty."""
    processes = max(1, min(processes, concurrency))
    base, extra = divmod(concurrency, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


def _probe_window(probe: OtherLoadProbe, start: float, end: float, result: list[float | None]) -> None:
    time.sleep(max(0.0, start - time.monotonic()))
    probe.start()
    time.sleep(max(0.0, end - time.monotonic()))
    result.append(probe.stop())


def measure(
    system: str,
    workload: str,
    target: Target,
    requests: Requests,
    concurrency: int,
    timing: Timing,
    client_processes: int = 1,
    server_session: int | None = None,
) -> tuple[Point, list[str]]:
    """Warm up, then measure one closed-loop point; returns the point and a few error messages.

    ``server_session``: the session id of the server's processes, so that CPU used by anything else
    during the window is reported (``Point.other_load``)."""
    shares = split_concurrency(concurrency, client_processes)
    start_at = time.monotonic() + (0.5 if len(shares) > 1 else 0.0)  # CLOCK_MONOTONIC is system-wide
    jobs = [(target, requests, share, timing, start_at, i * 7919) for i, share in enumerate(shares)]
    other: list[float | None] = []
    window = (start_at + timing.warmup_s, start_at + timing.warmup_s + timing.duration_s)
    probe = threading.Thread(
        target=_probe_window, args=(OtherLoadProbe(server_session), *window, other), daemon=True
    )
    probe.start()
    if len(jobs) == 1:
        parts = [_run_in_process(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
            parts = pool.map(_run_in_process, jobs)
    probe.join(timeout=5.0)
    latencies = [x for part in parts for x in part.latencies_s]
    errors = sum(part.errors for part in parts)
    examples = [e for part in parts for e in part.error_examples][:5]
    point = summarize(
        system,
        workload,
        concurrency,
        requests.texts_per_request,
        timing.duration_s,
        latencies,
        errors,
        client_cpu=sum(part.client_cpu for part in parts),
        other_load=other[0] if other else None,
    )
    return point, examples

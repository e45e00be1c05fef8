"""Open-loop HTTP load (workload W3): single texts arriving as a Poisson process at a fixed offered rate.

Unlike the closed loop (``bench.loadgen``), every request is sent at its own time from a schedule drawn
up front (exponential gaps, seeded), whether or not earlier requests have been answered, as independent
users would send them. Latency runs from the scheduled time to the answer. The only cap on requests in
flight is a generous safety bound (``MAX_IN_FLIGHT``); arrivals past it, and arrivals sent more than
``LATE_AFTER_S`` behind schedule, are counted. Which rates a system sustains: ``judge``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from bench.loadgen import EMBEDDING_KEY, Requests, Target, Timing, _probe_window
from bench.machine import OtherLoadProbe
from bench.results import Point, summarize

WORKLOAD = "W3"
MAX_IN_FLIGHT = 512  # safety bound only: far above what any system here holds at the offered rates
LATE_AFTER_S = 0.02  # an arrival sent later than this behind its schedule is "late"
MIN_ACHIEVED = 0.95  # of the rate offered in the window
MAX_FAILED = 0.01  # errors, unfinished and unsent, of the arrivals in the window
BACKLOG_FACTOR, BACKLOG_SLACK_MS = 2.0, 50.0  # last quarter's p50 above 2x the first's + 50 ms: growing


def window_s(rate: float, duration_s: float, min_requests: int) -> float:
    """The measured window at ``rate``: ``duration_s``, or longer where that holds fewer than
    ``min_requests`` arrivals on average (a p99 from a few hundred answers is one of the slowest few)."""
    return max(duration_s, min_requests / rate) if rate > 0 else duration_s


def poisson_schedule(rate: float, span_s: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start, increasing, below ``span_s``) of a Poisson process of
    ``rate`` per second: exponential gaps drawn from a generator seeded with ``seed``."""
    if rate <= 0 or span_s <= 0:
        raise ValueError(f"rate and span must be positive, got {rate} and {span_s}")
    rng = random.Random(seed)
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < span_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def pick_bodies(n_arrivals: int, n_bodies: int, seed: int) -> list[int]:
    """Which pre-encoded single text each arrival sends: uniform over the corpus (texts of mixed
    length), seeded, independent of the arrival times."""
    rng = random.Random(seed ^ 0x5EED)
    return [rng.randrange(n_bodies) for _ in range(n_arrivals)]


@dataclass
class Arrival:
    """One scheduled request; times in seconds from the start of the schedule."""

    scheduled: float
    sent: float | None = None  # None: not sent (the in-flight bound was reached)
    done: float | None = None  # None: unanswered by the drain deadline (or not sent)
    ok: bool = False
    problem: str = ""  # why it failed, as ``send`` said (``HTTP 503: ...``); empty when ok or unanswered


@dataclass
class Drive:
    arrivals: list[Arrival]
    peak_in_flight: int = 0
    problems: list[str] = field(default_factory=list)


Send = Callable[[int], Awaitable[tuple[bool, str]]]  # arrival index -> (ok, problem)


async def drive(
    schedule: Sequence[float], send: Send, drain_s: float, max_in_flight: int = MAX_IN_FLIGHT
) -> Drive:
    """Send arrival ``i`` at ``schedule[i]`` (by ``send(i)``) without waiting for earlier answers; after
    the last arrival, wait at most ``drain_s`` for the answers still out, then cancel them."""
    out = Drive([Arrival(t) for t in schedule])
    start = time.monotonic()
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        ok, problem = await send(i)
        out.arrivals[i].done, out.arrivals[i].ok = time.monotonic() - start, ok
        out.arrivals[i].problem = problem
        if problem and len(out.problems) < 5:
            out.problems.append(problem)

    for i, at in enumerate(schedule):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        if len(pending) >= max_in_flight:
            continue  # unsent: counted, never queued behind the bound
        out.arrivals[i].sent = time.monotonic() - start
        task = asyncio.create_task(one(i))
        pending.add(task)
        task.add_done_callback(pending.discard)
        out.peak_in_flight = max(out.peak_in_flight, len(pending))
    if pending:
        _, late = await asyncio.wait(set(pending), timeout=drain_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return out


def _p50_ms(values: Sequence[float]) -> float | None:
    return round(statistics.median(values) * 1000.0, 2) if values else None


def summarize_open_loop(
    system: str, rate: int, result: Drive, timing: Timing, client_cpu: float | None = None
) -> Point:
    """The point of the arrivals scheduled in the window [warm-up, warm-up + duration): their latencies
    (scheduled to answered) and failures, and as throughput the successful answers received inside the
    window; the open-loop figures go to ``setting``."""
    lo, hi = timing.warmup_s, timing.warmup_s + timing.duration_s
    window = [a for a in result.arrivals if lo <= a.scheduled < hi]
    good = [a for a in window if a.ok and a.done is not None]
    latencies = [a.done - a.scheduled for a in good if a.done is not None]
    answered = sum(1 for a in result.arrivals if a.ok and a.done is not None and lo <= a.done < hi)
    point = summarize(system, WORKLOAD, rate, 1, timing.duration_s, latencies, len(window) - len(good))
    achieved = round(answered / timing.duration_s, 2)
    quarter = timing.duration_s / 4
    first = [a.done - a.scheduled for a in good if a.done is not None and a.scheduled < lo + quarter]
    last = [a.done - a.scheduled for a in good if a.done is not None and a.scheduled >= hi - quarter]
    setting = {
        "offered_req_per_s": rate,
        "arrivals": len(window),
        "drawn_req_per_s": round(len(window) / timing.duration_s, 2),
        "late": sum(1 for a in window if a.sent is not None and a.sent - a.scheduled > LATE_AFTER_S),
        "unsent": sum(1 for a in window if a.sent is None),
        "unfinished": sum(1 for a in window if a.sent is not None and a.done is None),
        "peak_in_flight": result.peak_in_flight,
        "p50_first_quarter_ms": _p50_ms(first),
        "p50_last_quarter_ms": _p50_ms(last),
    }
    cpu = None if client_cpu is None else round(client_cpu, 3)
    return replace(point, req_per_s=achieved, seq_per_s=achieved, setting=setting, client_cpu=cpu)


def judge(point: Point, p99_bound_ms: float) -> tuple[bool, str]:
    """Whether ``point`` sustained its offered rate, and if not, why (the first failed test):
    answers >= 95 % of the rate drawn in the window, at most 1 % of its arrivals failed (errors,
    unanswered at the drain deadline, unsent for the in-flight bound), p99 within ``p99_bound_ms``, no
    growing backlog (the last quarter's median latency within 2x the first quarter's + 50 ms). Arrivals
    sent late are reported, not judged: latency runs from the scheduled time, so lateness counts already."""
    s = point.setting
    arrivals = int(s.get("arrivals", 0))
    if arrivals == 0:
        return False, "no arrivals in the window"
    drawn = float(s["drawn_req_per_s"])
    if point.req_per_s < MIN_ACHIEVED * drawn:
        return False, f"achieved {point.req_per_s:g} of {drawn:g} req/s offered"
    if point.errors > MAX_FAILED * arrivals:
        return False, f"{point.errors} of {arrivals} requests failed"
    if point.p99_ms is None or point.p99_ms > p99_bound_ms:
        return False, f"p99 {point.p99_ms} ms over {p99_bound_ms:g} ms"
    first, last = s.get("p50_first_quarter_ms"), s.get("p50_last_quarter_ms")
    if first is not None and last is not None and last > BACKLOG_FACTOR * first + BACKLOG_SLACK_MS:
        return False, f"backlog growing: p50 {first} ms in the first quarter, {last} ms in the last"
    return True, ""


def judged(point: Point, p99_bound_ms: float) -> Point:
    """``point`` with the verdict of ``judge`` in its setting (kept in results.json)."""
    ok, why = judge(point, p99_bound_ms)
    verdict = {"sustained": ok, "why": why, "p99_bound_ms": p99_bound_ms}
    return replace(point, setting={**point.setting, **verdict})


def sustained(point: Point | None) -> bool:
    return point is not None and bool(point.setting.get("sustained"))


async def _http_drive(
    target: Target, requests: Requests, schedule: list[float], picks: list[int], timing: Timing
) -> tuple[Drive, float]:
    """``drive`` over HTTP from one aiohttp session; also the client's CPU use (share of one core)."""
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT, limit_per_host=MAX_IN_FLIGHT)
    client_timeout = aiohttp.ClientTimeout(total=timing.request_timeout_s)
    headers = {"Content-Type": "application/json"}
    cpu0 = time.process_time()
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout, headers=headers) as session:

        async def send(i: int) -> tuple[bool, str]:
            b = picks[i]
            try:
                async with session.post(target.url, data=requests.bodies[b]) as resp:
                    body = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return False, f"{type(exc).__name__}: {exc}"
            if resp.status != 200:
                return False, f"HTTP {resp.status}: {body[:200]!r}"
            if body.count(EMBEDDING_KEY) != requests.counts[b]:
                return False, f"expected {requests.counts[b]} embeddings: {body[:200]!r}"
            return True, ""

        result = await drive(schedule, send, drain_s(timing))
    return result, (time.process_time() - cpu0) / (timing.warmup_s + timing.duration_s)


def drain_s(timing: Timing) -> float:
    """How long answers still out after the last arrival are waited for: bounded by the window."""
    return min(timing.request_timeout_s, max(2.0, timing.duration_s))


def run_schedule(
    target: Target,
    requests: Requests,
    schedule: list[float],
    picks: list[int],
    timing: Timing,
    server_session: int | None = None,
) -> tuple[Drive, float, float | None]:
    """Send ``requests.bodies[picks[i]]`` at ``schedule[i]`` over HTTP (``drive``); returns the arrivals,
    the client's CPU use (share of one core) and the CPU anything else used in the measured window
    (share of all CPUs; None: unknown). Cancelled requests are given time to drain from the server."""
    start = time.monotonic()
    window = (start + timing.warmup_s, start + timing.warmup_s + timing.duration_s)
    other: list[float | None] = []
    probe = threading.Thread(
        target=_probe_window, args=(OtherLoadProbe(server_session), *window, other), daemon=True
    )
    probe.start()
    result, cpu = asyncio.run(_http_drive(target, requests, schedule, picks, timing))
    probe.join(timeout=5.0)
    if any(a.sent is not None and a.done is None for a in result.arrivals):
        time.sleep(drain_s(timing))  # cancelled requests may still be queued in the server: let it drain
    return result, cpu, (None if not other or other[0] is None else round(other[0], 3))


def measure(
    system: str,
    target: Target,
    requests: Requests,
    rate: int,
    timing: Timing,
    seed: int,
    p99_bound_ms: float,
    server_session: int | None = None,
) -> tuple[Point, list[str]]:
    """One open-loop point at ``rate`` req/s (warm-up arrivals included, not counted), judged."""
    schedule = poisson_schedule(rate, timing.warmup_s + timing.duration_s, seed + rate)
    picks = pick_bodies(len(schedule), len(requests.bodies), seed + rate)
    result, cpu, other = run_schedule(target, requests, schedule, picks, timing, server_session)
    point = summarize_open_loop(system, rate, result, timing, client_cpu=cpu)
    return judged(replace(point, other_load=other), p99_bound_ms), result.problems

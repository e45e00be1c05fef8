"""The open-loop workload W3: its Poisson schedule, arrivals that never wait for answers, the verdict."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import replace

import pytest

from bench.loadgen import Timing
from bench.openloop import (
    Arrival,
    Drive,
    drive,
    judge,
    judged,
    pick_bodies,
    poisson_schedule,
    summarize_open_loop,
    sustained,
    window_s,
)
from bench.results import Point


def test_the_window_grows_to_hold_the_arrivals_a_p99_needs() -> None:
    assert window_s(10, 15.0, 1000) == 100.0  # 150 arrivals in 15 s: too few for a p99
    assert window_s(40, 15.0, 1000) == 25.0
    assert window_s(100, 15.0, 1000) == 15.0  # never shorter than the duration asked for
    assert window_s(10, 15.0, 0) == 15.0  # 0: the duration alone


def test_schedule_is_seeded_increasing_and_within_the_span() -> None:
    a = poisson_schedule(30.0, 20.0, seed=7)
    assert a == poisson_schedule(30.0, 20.0, seed=7)
    assert a != poisson_schedule(30.0, 20.0, seed=8)
    assert all(x < y for x, y in itertools.pairwise(a)) and a[0] > 0 and a[-1] < 20.0
    with pytest.raises(ValueError):
        poisson_schedule(0.0, 10.0, seed=0)


@pytest.mark.parametrize("rate", [10.0, 40.0, 60.0])
def test_schedule_has_the_mean_rate_and_exponential_gaps(rate: float) -> None:
    span = 2000.0 / rate  # about 2000 arrivals: the count is within 3 % at 1.3 sigma; seeds fixed
    times = poisson_schedule(rate, span, seed=1)
    assert abs(len(times) / span - rate) / rate < 0.05
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    assert abs(mean - 1 / rate) * rate < 0.05
    # Exponential: the standard deviation equals the mean (a fixed-interval schedule would have 0),
    # and about 1 - 1/e = 63 % of the gaps are shorter than the mean.
    assert abs(statistics.stdev(gaps) / mean - 1.0) < 0.1
    assert 0.58 < sum(g < mean for g in gaps) / len(gaps) < 0.68


def test_bodies_are_drawn_from_the_whole_corpus() -> None:
    picks = pick_bodies(5000, 100, seed=3)
    assert picks == pick_bodies(5000, 100, seed=3) and len(set(picks)) == 100
    assert picks[:50] != list(range(50))  # not in corpus order: lengths mixed at every rate


def test_arrivals_are_sent_on_schedule_while_earlier_ones_are_unanswered() -> None:
    schedule = [0.0, 0.02, 0.04, 0.06, 0.08]
    sent_at: list[float] = []
    start = time.monotonic()

    async def slow(i: int) -> tuple[bool, str]:
        sent_at.append(time.monotonic() - start)
        await asyncio.sleep(0.3)  # far longer than the gaps: a closed loop would send one at a time
        return True, ""

    result = asyncio.run(drive(schedule, slow, drain_s=2.0))
    assert len(sent_at) == 5 and sent_at[-1] < 0.25  # all out before the first answer came back
    assert result.peak_in_flight == 5
    assert all(a.ok and a.sent is not None and a.done is not None for a in result.arrivals)
    assert all(a.done - a.scheduled >= 0.29 for a in result.arrivals if a.done is not None)


def test_the_safety_bound_and_the_drain_deadline_are_counted_not_waited_for() -> None:
    async def never(i: int) -> tuple[bool, str]:
        await asyncio.sleep(60)
        return True, ""

    t0 = time.monotonic()
    result = asyncio.run(drive([0.0, 0.01, 0.02, 0.03], never, drain_s=0.1, max_in_flight=2))
    assert time.monotonic() - t0 < 1.0  # cancelled at the drain deadline, not after 60 s
    assert [a.sent is None for a in result.arrivals] == [False, False, True, True]  # unsent past the bound
    assert all(a.done is None and not a.ok for a in result.arrivals)


def _drive(rate: float, latency_s: float, seconds: float = 10.0, fail_every: int = 0) -> Drive:
    """A fake run: arrivals at ``rate`` (evenly), each answered after ``latency_s``."""
    arrivals = []
    for i in range(int(rate * seconds)):
        t = i / rate
        ok = not fail_every or i % fail_every != 0
        arrivals.append(Arrival(scheduled=t, sent=t, done=t + latency_s, ok=ok))
    return Drive(arrivals, peak_in_flight=3)


TIMING = Timing(warmup_s=2.0, duration_s=8.0)


def test_summary_counts_the_window_only() -> None:
    p = summarize_open_loop("svc", 20, _drive(20.0, 0.05), TIMING, client_cpu=0.04)
    assert (p.workload, p.concurrency, p.texts_per_request) == ("W3", 20, 1)
    assert p.setting["arrivals"] == 160 and p.setting["drawn_req_per_s"] == 20.0
    assert p.requests == 160 and p.errors == 0 and p.p50_ms == 50.0
    # Answers received inside the window: those of arrivals from 1.95 s to 9.95 s.
    assert p.req_per_s == 20.0 and p.setting["peak_in_flight"] == 3
    assert judge(p, 500.0) == (True, "")


def test_a_system_falling_behind_is_not_sustained() -> None:
    # Capacity 10 req/s against 20 offered: the n-th answer comes at n / 10 s, latency grows without end.
    arrivals = [Arrival(i / 20, i / 20, (i + 1) / 10, True) for i in range(200)]
    p = summarize_open_loop("slow", 20, Drive(arrivals), TIMING)
    assert p.req_per_s == pytest.approx(10.0, abs=0.2)
    ok, why = judge(p, 100_000.0)  # even without a p99 bound
    assert not ok and why.startswith("achieved")


def test_each_test_of_the_verdict_can_fail_on_its_own() -> None:
    good = summarize_open_loop("svc", 20, _drive(20.0, 0.05), TIMING)
    assert judge(good, 500.0)[0]
    slow_tail = summarize_open_loop("svc", 20, _drive(20.0, 0.6), TIMING)
    assert judge(slow_tail, 500.0) == (False, "p99 600.0 ms over 500 ms")
    failing = summarize_open_loop("svc", 20, _drive(20.0, 0.05, fail_every=20), TIMING)  # 5 % fail
    assert judge(failing, 500.0)[1].startswith("8 of 160 requests failed")
    backlog = replace(
        good, setting={**good.setting, "p50_first_quarter_ms": 20.0, "p50_last_quarter_ms": 95.0}
    )
    assert judge(backlog, 500.0)[1].startswith("backlog growing")
    within = replace(
        good, setting={**good.setting, "p50_first_quarter_ms": 20.0, "p50_last_quarter_ms": 85.0}
    )
    assert judge(within, 500.0)[0]
    # Late sends are reported, not judged: latency runs from the scheduled time, so they count already.
    assert judge(replace(good, setting={**good.setting, "late": 50}), 500.0)[0]
    empty = replace(good, setting={**good.setting, "arrivals": 0})
    assert judge(empty, 500.0) == (False, "no arrivals in the window")


def test_the_verdict_is_kept_with_the_point() -> None:
    point = judged(summarize_open_loop("svc", 20, _drive(20.0, 0.6), TIMING), 500.0)
    assert point.setting["sustained"] is False and "p99" in point.setting["why"]
    assert point.setting["p99_bound_ms"] == 500.0 and not sustained(point) and not sustained(None)
    again = judged(summarize_open_loop("svc", 20, _drive(20.0, 0.6), TIMING), 1000.0)
    assert sustained(again) and isinstance(again, Point)

"""Percentiles, point summaries and the JSON form of a run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.results import (
    Point,
    RunReport,
    SystemInfo,
    percentile,
    percentile_interval,
    retry_disturbed,
    summarize,
)


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 99.9, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    rng = np.random.default_rng(3)
    values = list(rng.lognormal(0.0, 1.0, size=257))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_small_cases() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0  # order of the input does not matter
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_percentile_interval_is_two_order_statistics_around_the_rank() -> None:
    values = [float(v) for v in range(1000, 0, -1)]  # 1..1000, given in reverse
    # n*p = 990, z*sqrt(n*p*(1-p)) = 6.17: ranks 983 and 997, the 18th and the 4th slowest
    assert percentile_interval(values, 99) == (983.0, 997.0)
    assert percentile_interval(values, 50) == (469.0, 531.0)
    wider = percentile_interval(values, 99, confidence=0.99)
    assert wider is not None and wider[0] < 983.0 and wider[1] > 997.0
    assert percentile_interval(values[:200], 99) is None  # 200 answers bound no p99 from above
    assert percentile_interval([], 99) is None
    with pytest.raises(ValueError):
        percentile_interval(values, 100)


def test_percentile_interval_covers_the_true_p99_about_as_often_as_it_says() -> None:
    rng = np.random.default_rng(11)
    true_p99 = float(np.log(100.0))  # the exponential distribution's 99th percentile
    trials = 600
    covered = 0
    for _ in range(trials):
        bounds = percentile_interval(list(rng.exponential(1.0, size=1000)), 99)
        assert bounds is not None and bounds[0] <= bounds[1]
        covered += bounds[0] <= true_p99 <= bounds[1]
    assert 0.92 <= covered / trials <= 0.985


def test_summarize_rates_and_percentiles() -> None:
    latencies = [0.010] * 98 + [0.100, 0.200]
    p = summarize("svc", "W2", 4, 32, 10.0, latencies, errors=2, client_cpu=0.123456)
    assert p.requests == 100
    assert p.req_per_s == 10.0
    assert p.seq_per_s == 320.0
    assert p.p50_ms == 10.0
    assert 100.0 < p.p99_ms < 200.0
    assert p.errors == 2
    assert p.error_rate == pytest.approx(2 / 102)
    assert p.client_cpu == 0.123


def test_summarize_without_successes_has_no_percentiles() -> None:
    p = summarize("svc", "W1", 8, 1, 5.0, [], errors=7)
    assert (p.requests, p.req_per_s, p.p50_ms, p.p99_ms) == (0, 0.0, None, None)
    assert (p.p99_low_ms, p.p99_high_ms) == (None, None)
    assert p.error_rate == 1.0


def test_report_json_round_trip(tmp_path: Path) -> None:
    rep = RunReport("python -m bench run", {"nproc": 2}, {"quick": True}, {"texts": 10})
    rep.systems.append(SystemInfo("service", "service", "this service", ran=True, check_min_cosine=0.99999))
    rep.points.append(summarize("service", "W1", 8, 1, 2.0, [0.01, 0.02], 0, setting={"max_batch_size": 8}))
    path = tmp_path / "results.json"
    rep.save(path)
    back = RunReport.load(path)
    assert back.points == rep.points
    assert back.systems == rep.systems
    assert back.point("service", "W1", 8) == rep.points[0]
    assert back.point("service", "W1", 32) is None
    assert isinstance(back.points[0], Point)


def test_report_with_nested_paths_saves(tmp_path: Path) -> None:
    # `--inprocess onnx=DIR` puts (label, Path) pairs inside the options; saving used to fail on them.
    options = {"inprocess": [("onnx", tmp_path / "model")], "out": str(tmp_path)}
    rep = RunReport("python -m bench run --inprocess onnx=DIR", {"nproc": 2}, options, {"texts": 1})
    rep.save(tmp_path / "results.json")
    assert RunReport.load(tmp_path / "results.json").options["inprocess"] == [
        ["onnx", str(tmp_path / "model")]
    ]


def test_retry_disturbed_keeps_the_least_disturbed_point() -> None:
    loads = iter([0.5, 0.3, 0.05, 0.0])
    calls = []

    def once() -> tuple[Point, list[str]]:
        calls.append(1)
        return summarize("s", "W1", 1, 1, 1.0, [0.01], 0, other_load=next(loads)), []

    point, _, taken = retry_disturbed(once, max_other_load=0.1, retries=5)
    assert (point.other_load, taken) == (0.05, 3)  # stops at the first quiet window
    loads = iter([0.5, 0.7, 0.6])
    point, _, taken = retry_disturbed(once, max_other_load=0.1, retries=2)
    assert (point.other_load, taken) == (0.5, 3)  # bounded; the best of the disturbed ones
    quiet = iter([0.0])
    point, _, taken = retry_disturbed(
        lambda: (summarize("s", "W1", 1, 1, 1.0, [0.01], 0, other_load=next(quiet)), []), 0.1, 2
    )
    assert taken == 1


def test_points_keep_their_round_and_old_results_load_as_round_one(tmp_path: Path) -> None:
    rep = RunReport("python -m bench run --rounds 2", {"nproc": 2}, {}, {"texts": 10})
    rep.systems += [
        SystemInfo("inprocess-onnx", "inprocess", "onnx", ran=True),
        SystemInfo("service", "service", "svc", ran=True),
    ]
    first = summarize("service", "W1", 8, 1, 2.0, [0.01, 0.02], 0)
    rep.points += [summarize("inprocess-onnx", "b1", 1, 1, 1.0, [0.01], 0), first, replace(first, round=2)]
    assert rep.rounds == 2
    second = rep.in_round(2)
    assert [(p.system, p.round) for p in second.points] == [("inprocess-onnx", 1), ("service", 2)]
    assert second.systems == rep.systems and rep.in_round(1).point("service", "W1") == first
    path = tmp_path / "results.json"
    rep.save(path)
    assert [p.round for p in RunReport.load(path).points] == [1, 1, 2]
    # results.json written before rounds existed: every point is round 1
    raw = json.loads(path.read_text())
    for point in raw["points"]:
        del point["round"]
    path.write_text(json.dumps(raw))
    old = RunReport.load(path)
    assert [p.round for p in old.points] == [1, 1, 1] and old.rounds == 1


def test_summarize_bounds_the_p99_once_there_are_enough_answers() -> None:
    latencies = [i / 1000.0 for i in range(1, 1001)]  # 1..1000 ms
    p = summarize("svc", "W3", 10, 1, 100.0, latencies, errors=0)
    assert (p.p99_low_ms, p.p99_high_ms) == (983.0, 997.0)
    assert p.p99_low_ms <= p.p99_ms <= p.p99_high_ms
    few = summarize("svc", "W3", 10, 1, 10.0, latencies[:100], errors=0)
    assert few.p99_ms is not None and (few.p99_low_ms, few.p99_high_ms) == (None, None)

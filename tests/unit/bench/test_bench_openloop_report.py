"""W3 in the report: the Infinity configuration that sets the bar, one ratio row per rate, table, plot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.cli import parse
from bench.openloop import judged
from bench.openloop_report import best_sustaining, open_loop_table
from bench.plot import plot_open_loop
from bench.ratios import compute_ratios, ratios_over_rounds
from bench.report import render
from bench.results import Point, RunReport, SystemInfo, summarize

BOUND_MS = 500.0


def _w3(system: str, rate: int, p50_s: float, p99_s: float, achieved: float | None = None) -> Point:
    """An open-loop point of 100 arrivals in a 10 s window (drawn = offered), judged against 500 ms."""
    latencies = [p50_s] * 98 + [p99_s] * 2
    p = summarize(system, "W3", rate, 1, 10.0, latencies, 0)
    got = rate if achieved is None else achieved
    setting = {"arrivals": 100, "drawn_req_per_s": float(rate), "late": 0, "unsent": 0, "unfinished": 0}
    return judged(replace(p, req_per_s=got, seq_per_s=got, setting=setting), BOUND_MS)


def _report() -> RunReport:
    rep = RunReport("python -m bench run", {"nproc": 2}, {}, {"texts": 100})
    rep.systems += [
        SystemInfo("service", "service", "svc", ran=True),
        SystemInfo("infinity-torch", "infinity", "inf", ran=True),
        SystemInfo("infinity-onnx", "infinity", "inf onnx", ran=True),
    ]
    rep.points += [
        summarize("service", "W1", 1, 1, 10.0, [0.02] * 600, 0),  # 60 req/s
        summarize("infinity-torch", "W1", 1, 1, 10.0, [0.02] * 500, 0),  # 50 req/s
        summarize("infinity-onnx", "W1", 1, 1, 10.0, [0.02] * 450, 0),
        _w3("service", 10, 0.010, 0.020),
        _w3("service", 30, 0.015, 0.060),
        _w3("service", 60, 0.030, 0.900),  # p99 over the bound
        _w3("infinity-torch", 10, 0.012, 0.030),
        _w3("infinity-torch", 30, 0.014, 0.050),
        _w3("infinity-torch", 60, 2.0, 4.0, achieved=40.0),  # falls behind
        _w3("infinity-onnx", 10, 0.008, 0.015),  # fastest at 10, but sustains only that rate
        _w3("infinity-onnx", 30, 1.0, 2.0, achieved=25.0),
        _w3("infinity-onnx", 60, 3.0, 5.0, achieved=26.0),
    ]
    return rep


def test_infinitys_best_is_the_configuration_sustaining_the_highest_rate() -> None:
    rep = _report()
    name, point = best_sustaining(rep)
    assert name == "infinity-torch" and point is not None and point.concurrency == 30
    # Both sustaining 30 req/s: the lower p99 there wins.
    rep.points.append(_w3("infinity-onnx", 30, 0.010, 0.040))
    rep.points = [
        p
        for p in rep.points
        if not (p.system == "infinity-onnx" and p.concurrency == 30 and p.p99_ms == 2000.0)
    ]
    assert best_sustaining(rep)[0] == "infinity-onnx"
    assert best_sustaining(RunReport("c", {}, {}, {})) == ("any infinity system", None)


def test_one_p50_and_one_p99_row_per_rate_with_a_bar_where_infinity_sustains_it() -> None:
    ratios = {r.name: r for r in compute_ratios(_report(), ["service"], open_loop_rates=[10, 30, 60])}
    p50 = ratios["service W3 10 req/s p50 ÷ Infinity's best"]
    assert p50.value == 0.83 and p50.met is True and p50.target == "<= 1"
    assert "infinity-torch W3 at 10 req/s" in p50.detail  # the best configuration, not the fastest at 10
    p99 = ratios["service W3 30 req/s p99 ÷ Infinity's best"]
    assert p99.value == 1.2 and p99.met is False
    assert ratios["service W3 30 req/s p50 ÷ Infinity's best"].met is False  # 15 vs 14 ms
    at_60 = ratios["service W3 60 req/s p99 ÷ Infinity's best"]
    assert at_60.value is None and at_60.met is None and "did not sustain 60 req/s" in at_60.detail
    w3_rows = [n for n in ratios if " W3 " in n]
    assert len(w3_rows) == 6


def test_the_service_failing_a_rate_infinity_sustains_is_a_miss() -> None:
    rep = _report()
    rep.points = [p for p in rep.points if not (p.system == "service" and p.concurrency == 30)]
    rep.points.append(_w3("service", 30, 0.4, 3.0, achieved=20.0))
    ratios = {r.name: r for r in compute_ratios(rep, ["service"], open_loop_rates=[30])}
    row = ratios["service W3 30 req/s p99 ÷ Infinity's best"]
    assert row.met is False and "service did not sustain it: achieved 20" in row.detail


def test_w1_single_text_one_at_a_time_against_infinitys_best() -> None:
    ratios = {r.name: r for r in compute_ratios(_report(), ["service"])}
    row = ratios["service W1 c=1 req/s ÷ Infinity's best"]
    assert row.value == 1.2 and row.met is True and row.target == ">= 1"
    assert "infinity-torch W1 c=1" in row.detail
    assert not any(" W3 " in n for n in ratios)  # no rates asked for: no open-loop rows


def test_open_loop_rows_get_medians_over_rounds() -> None:
    rep = _report()
    for p in list(rep.points):  # round 2: the service's p50 at 10 req/s doubles
        slow = p.system == "service" and p.workload == "W3" and p.concurrency == 10
        rep.points.append(replace(_w3("service", 10, 0.020, 0.020) if slow else p, round=2))
    ratios = {r.name: r for r in ratios_over_rounds(rep, ["service"], open_loop_rates=[10, 60])}
    median = ratios["service W3 10 req/s p50 ÷ Infinity's best"]
    assert median.value == 1.25 and median.met is False  # median of 0.83 and 1.67
    assert "(0.83, 1.67)" in median.detail
    assert ratios["service W3 60 req/s p50 ÷ Infinity's best"].met is None  # no bar in any round


def test_open_loop_table_and_report_section() -> None:
    rep = _report()
    table = open_loop_table(rep.points).splitlines()
    assert len(table) == 2 + 9 and all(line.count("|") == 13 for line in table)
    assert "| service | 10 | 10.0 | 10.0 | 10.0 | 20.0 | 0 of 100 |" in table[2]
    assert table[4].endswith("**no**: p99 900.0 ms over 500 ms |")
    text = render(rep, None, open_loop_plot="open-loop.png")
    assert "## Open loop (W3)" in text and "![open loop: latency against offered rate](open-loop.png)" in text
    results = text.split("## Results")[1].split("## Open loop")[0]
    assert "| W1 |" in results and "| W3 |" not in results  # W3 only in its own table
    assert "Open loop" not in render(RunReport("c", {}, {}, {}), None)


def test_open_loop_plot_is_written(tmp_path: Path) -> None:
    out = plot_open_loop(_report().points, tmp_path / "open-loop.png", title="run")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_open_loop_options() -> None:
    assert parse(["run"]).open_loop_rates == [10, 20, 30, 40, 60]
    assert parse(["run", "--quick"]).open_loop_rates == [10, 30]
    opts = parse(["run", "--open-loop-rates", "30,10,30", "--open-loop-p99-ms", "250"])
    assert opts.open_loop_rates == [10, 30] and opts.open_loop_p99_ms == 250.0
    assert parse(["run", "--no-open-loop"]).open_loop_rates == []
    assert parse(["ramp"]).open_loop_rates == []


def _w3_of(system: str, latencies_s: list[float]) -> Point:
    """An open-loop point at 30 req/s from these answers' latencies (all sustained)."""
    p = summarize(system, "W3", 30, 1, len(latencies_s) / 30, latencies_s, 0)
    n = float(len(latencies_s))
    setting = {"arrivals": n, "drawn_req_per_s": 30.0, "late": 0, "unsent": 0, "unfinished": 0}
    return judged(replace(p, setting=setting), BOUND_MS)


def test_the_p99_row_says_whether_the_two_intervals_are_apart() -> None:
    # Two draws of 1000 from one distribution with a long tail (10 ms + exponential, mean 5 ms): their
    # p99s differ, but by less than either's interval.
    rng = np.random.default_rng(5)
    base = [0.010 + t for t in rng.exponential(0.005, size=1000)]
    other = [0.010 + t for t in rng.exponential(0.005, size=1000)]
    rep = RunReport("python -m bench run", {"nproc": 2}, {}, {"texts": 100})
    rep.systems += [
        SystemInfo("service", "service", "svc", ran=True),
        SystemInfo("infinity-onnx", "infinity", "inf onnx", ran=True),
    ]
    rep.points += [_w3_of("service", other), _w3_of("infinity-onnx", base)]
    close = {r.name: r for r in compute_ratios(rep, ["service"], open_loop_rates=[30])}
    row = close["service W3 30 req/s p99 ÷ Infinity's best"]
    assert row.value != 1.0 and "overlapping: this run does not tell them apart" in row.detail
    assert "p99" not in close["service W3 30 req/s p50 ÷ Infinity's best"].detail.split(";")[-1]
    rep.points[0] = _w3_of("service", [t * 1.6 for t in base])
    far = {r.name: r for r in compute_ratios(rep, ["service"], open_loop_rates=[30])}
    assert "(apart)" in far["service W3 30 req/s p99 ÷ Infinity's best"].detail
    # A closed-loop p99 ratio says the same of its two points.
    rep.points += [replace(p, workload="W1", concurrency=8) for p in rep.points]
    closed = {r.name: r for r in compute_ratios(rep, ["service"])}
    assert "(apart)" in closed["service W1 c=8 p99 ÷ that Infinity's p99"].detail
    rep.points = rep.points[:2]
    table = open_loop_table(rep.points)
    assert "| 49.5 [44.2-59.7] |" in table  # the service's p99, and where it lies

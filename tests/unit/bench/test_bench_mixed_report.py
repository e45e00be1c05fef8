"""W4 in the report: Infinity's bar, the judged targets (texts/s, 1-4-text p99, errors), tables, rounds."""

from __future__ import annotations

from dataclasses import replace

from bench.loadgen import Timing
from bench.mixed import summarize_mixed
from bench.mixed_report import best_infinity, errors_cell, mixed_table, side_by_side, small_p99
from bench.openloop import Arrival, Drive, judged
from bench.ratios import compute_ratios, ratios_over_rounds
from bench.report import render
from bench.results import Point, Ratio, RunReport, SystemInfo

TIMING = Timing(warmup_s=0.0, duration_s=20.0)
BOUND_MS = 10_000.0


def _w4(system: str, small_ms: float, errors: int = 0, status: str = "HTTP 503", round_no: int = 1) -> Point:
    """A judged W4 point: 200 arrivals at 10 req/s, sizes 1, 2, 3, 4, 32 in turn (a 256 at 5 s); small
    requests answered in ``small_ms`` (every tenth in twice that), 32s in 200 ms, the 256 in 1 s; the first
    ``errors`` small requests fail with ``status``."""
    arrivals, sizes, failed = [], [], 0
    for i in range(200):
        t = i * 0.1
        n = 256 if i == 50 else [1, 2, 3, 4, 32][i % 5]
        latency = 1.0 if n == 256 else 0.2 if n == 32 else small_ms / 1000 * (2 if i % 10 == 0 else 1)
        a = Arrival(t, sent=t, done=t + latency, ok=True)
        if n <= 4 and failed < errors:
            a.ok, a.problem, failed = False, f"{status}: b'no'", failed + 1
        arrivals.append(a)
        sizes.append(n)
    point = summarize_mixed(system, 10.0, Drive(arrivals), sizes, TIMING)
    return replace(judged(point, BOUND_MS), round=round_no)


def _report(*points: Point) -> RunReport:
    rep = RunReport("cmd", {}, {}, {}, points=list(points))
    rep.systems = [SystemInfo("service", "service", "svc", ran=True)]
    names = dict.fromkeys(p.system for p in points if p.system.startswith("infinity"))
    rep.systems += [SystemInfo(n, "infinity", "inf", ran=True) for n in names]
    return rep


def _w4_ratios(rep: RunReport) -> dict[str, Ratio]:
    ratios = compute_ratios(rep, ["service"], closed_loop=False, mixed_sizes=True)
    return {r.name.removeprefix("service W4 "): r for r in ratios}


def test_infinitys_bar_kept_up_with_the_fewest_errors_then_the_lowest_small_p99() -> None:
    behind = _w4("infinity-torch", 10.0)
    behind = replace(behind, setting={**behind.setting, "sustained": False, "why": "backlog growing"})
    rep = _report(
        _w4("service", 20.0),
        behind,  # the lowest p99, but it did not keep up
        _w4("infinity-torch-bf16", 30.0, errors=2),  # kept up, with errors
        _w4("infinity-onnx", 40.0),
    )
    assert best_infinity(rep)[0] == "infinity-onnx"
    assert best_infinity(_report(_w4("service", 20.0))) == ("any infinity system", None)


def test_a_service_faster_on_small_requests_without_errors_meets_every_target() -> None:
    ratios = _w4_ratios(_report(_w4("service", 20.0), _w4("infinity-onnx", 40.0)))
    texts, p99, errors = (
        ratios["texts/s ÷ Infinity's"],
        ratios["1-4-text p99 ÷ Infinity's"],
        ratios["errors (0 where Infinity has 0)"],
    )
    assert (texts.value, texts.target, texts.met) == (1.0, ">= 1", True)  # both answered all offered
    assert (p99.value, p99.target, p99.met) == (0.5, "<= 1", True)
    assert p99.detail.startswith("40.0 / 80.0 ms p99 of 1-4-text requests (service vs infinity-onnx")
    assert (errors.value, errors.met) == (0.0, True)


def test_errors_where_infinity_has_none_are_missed_and_cost_texts() -> None:
    ratios = _w4_ratios(_report(_w4("service", 20.0, errors=5), _w4("infinity-onnx", 40.0)))
    errors = ratios["errors (0 where Infinity has 0)"]
    assert (errors.value, errors.target, errors.met) == (5.0, "<= 0", False)
    assert "service 5 (HTTP 503: 5), infinity-onnx 0" in errors.detail
    texts = ratios["texts/s ÷ Infinity's"]
    assert texts.value is not None and texts.value < 1 and texts.met is False


def test_no_bar_on_errors_where_infinity_has_some() -> None:
    ratios = _w4_ratios(_report(_w4("service", 20.0, errors=1), _w4("infinity-onnx", 40.0, errors=3)))
    errors = ratios["errors (0 where Infinity has 0)"]
    assert errors.value is None and errors.met is None and "infinity-onnx had errors: no bar" in errors.detail


def test_a_slower_small_p99_or_none_at_all_is_missed() -> None:
    slower = _w4_ratios(_report(_w4("service", 50.0), _w4("infinity-onnx", 40.0)))
    assert slower["1-4-text p99 ÷ Infinity's"].met is False
    nothing = _w4("service", 20.0, errors=200, status="ServerDisconnectedError")  # every small one failed
    assert small_p99(nothing) is None
    ratio = _w4_ratios(_report(nothing, _w4("infinity-onnx", 40.0)))["1-4-text p99 ÷ Infinity's"]
    assert ratio.value is None and ratio.met is False


def test_rows_say_why_a_side_is_missing_and_appear_only_when_asked() -> None:
    rep = _report(_w4("service", 20.0))
    rep.systems.append(SystemInfo("infinity-onnx", "infinity", "inf", reason="Infinity unavailable: no pip"))
    ratios = _w4_ratios(rep)
    assert len(ratios) == 3 and all(r.value is None for r in ratios.values())
    assert "Infinity unavailable: no pip" in ratios["texts/s ÷ Infinity's"].detail
    assert not any("W4" in r.name for r in compute_ratios(rep, ["service"]))  # mixed_sizes off: no rows
    names = [r.name for r in compute_ratios(rep, ["service"], mixed_sizes=True)]
    assert names[0].startswith("service W2") and names[-1].startswith("service W4")  # after the others


def test_medians_over_rounds() -> None:
    rep = _report(
        _w4("service", 20.0, round_no=1),
        _w4("infinity-onnx", 40.0, round_no=1),
        _w4("service", 60.0, round_no=2),
        _w4("infinity-onnx", 40.0, round_no=2),
        _w4("service", 30.0, round_no=3),
        _w4("infinity-onnx", 40.0, round_no=3),
    )
    ratios = {r.name: r for r in ratios_over_rounds(rep, ["service"], closed_loop=False, mixed_sizes=True)}
    p99 = ratios["service W4 1-4-text p99 ÷ Infinity's"]
    assert (p99.value, p99.met) == (0.75, True) and "(0.50, 1.50, 0.75)" in p99.detail
    assert ratios["round 2: service W4 1-4-text p99 ÷ Infinity's"].met is False


def test_table_side_by_side_and_report_section() -> None:
    rep = _report(_w4("service", 20.0, errors=3), _w4("infinity-onnx", 40.0))
    table = mixed_table(rep.points).splitlines()
    assert len(table) == 2 + 2 * 4  # header, rule, then "all" and one row per size class for each system
    assert table[2].startswith("| service | all | 200 | 3 (HTTP 503: 3) |")
    assert table[3].startswith("| service | 1-4 | 159 | 3 (HTTP 503: 3) | 20.0 | 40.0")
    assert "| service | 256 | 1 | 0 | 1000.0 |" in table[5]
    assert errors_cell(0, {}) == "0"
    rows = side_by_side(rep, ["service"]).splitlines()
    assert len(rows) == 3 and rows[2].startswith("| 1 | service |") and "| infinity-onnx |" in rows[2]
    assert rows[2].endswith("| 0.50 |")  # 1-4-text p99: 40 ms against 80 (every tenth small one is 2x)
    rep.ratios = compute_ratios(rep, ["service"], closed_loop=False, mixed_sizes=True)
    md = render(rep, plot_name=None)
    assert "## Mixed request sizes, open loop (W4)" in md and "80% 1-4, 17% 32, 3% 256" in md
    assert "| W4 |" not in md  # not in the closed-loop table
    assert "service W4 errors (0 where Infinity has 0) | 3.00 | <= 0 | **no** |" in md

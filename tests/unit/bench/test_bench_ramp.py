"""Ramp mode: concurrency steps, stop rules and knee detection."""

from __future__ import annotations

from bench.ramp import best_within, concurrency_steps, find_knee, next_concurrency, stop_reason
from bench.results import Point, summarize


def _p(conc: int, seq_per_s: float, p99_ms: float, errors: int = 0) -> Point:
    n = int(seq_per_s * 10)
    return summarize("svc", "ramp", conc, 1, 10.0, [p99_ms / 1000] * n, errors)


def test_concurrency_steps_are_bounded_and_increasing() -> None:
    assert concurrency_steps(1, 2.0, 256, 12) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert concurrency_steps(1, 2.0, 1000, 3) == [1, 2, 4]
    assert concurrency_steps(1, 1.2, 5, 10) == [1, 2, 3, 4, 5]  # always at least +1
    assert next_concurrency(10, 1.5) == 15


def test_knee_is_where_throughput_flattens() -> None:
    curve = [_p(1, 30, 40), _p(2, 55, 45), _p(4, 80, 60), _p(8, 84, 120), _p(16, 85, 250)]
    assert find_knee(curve, 0.1).concurrency == 4
    assert find_knee(curve, 0.02).concurrency == 8  # 84 -> 85 is +1.2 %
    assert find_knee(curve[:3], 0.1).concurrency == 4  # still climbing: the last point
    assert find_knee([], 0.1) is None


def test_knee_when_throughput_drops() -> None:
    curve = [_p(1, 30, 40), _p(2, 60, 45), _p(4, 50, 300)]
    assert find_knee(curve, 0.1).concurrency == 2


def test_stop_reason() -> None:
    assert stop_reason(_p(4, 50, 200), 500, 0.01) == ""
    assert "p99" in stop_reason(_p(8, 50, 800), 500, 0.01)
    assert "errors" in stop_reason(_p(8, 10, 100, errors=5), 500, 0.01)
    assert "no successful" in stop_reason(summarize("s", "ramp", 8, 1, 1.0, [], 0), 500, 0.01)


def test_best_within_target() -> None:
    curve = [_p(1, 30, 40), _p(2, 60, 300), _p(4, 70, 900)]
    assert best_within(curve, 500, 0.01).concurrency == 2
    assert best_within(curve, 10, 0.01) is None

"""The latency-throughput plot: one curve per start of each system."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.plot import _series, plot_run
from bench.results import Point, summarize


def _points() -> list[Point]:
    def point(system: str, conc: int, rate: float, round_no: int = 1) -> Point:
        p = summarize(system, "W1", conc, 1, 1.0, [1.0 / rate] * int(rate), 0)
        return replace(p, round=round_no)

    return [
        point("service", 8, 170.0),
        point("service", 1, 60.0),
        point("infinity-onnx", 8, 160.0),
        point("service", 8, 150.0, 2),
        point("service", 1, 55.0, 2),
    ]


def test_series_are_per_system_and_round_in_concurrency_order() -> None:
    series = _series(_points(), "W1")
    assert sorted(series) == [("infinity-onnx", 1), ("service", 1), ("service", 2)]
    assert [p.concurrency for p in series[("service", 2)]] == [1, 8]
    assert [p.req_per_s for p in series[("service", 1)]] == [60.0, 170.0]
    assert _series(_points(), "W2") == {}


def test_plot_of_several_rounds_is_written(tmp_path: Path) -> None:
    out = plot_run(_points(), tmp_path / "plot.png", title="python -m bench run --rounds 2")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

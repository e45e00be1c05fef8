"""The generation benchmark's figures: points from stream records, ratios and their targets, the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import generate_report
from bench.generate_judge import http_ratios
from bench.generate_load import CANCELLED_AT_END, StreamRecord
from bench.generate_stats import (
    CLOSED,
    OPEN,
    DesignRow,
    GenPoint,
    GenReport,
    SystemRun,
    design_ratios,
    judge_open,
    summarize_closed,
    summarize_open,
)

# ---- points ----


def _rec(
    sent: float,
    first: float,
    last: float,
    tokens: int,
    ended: float | None = None,
    error: str | None = None,
    chunks: int | None = None,
) -> StreamRecord:
    r = StreamRecord(
        sent=sent,
        first=first,
        last=last,
        chunks=chunks or tokens,
        completion_tokens=tokens,
        prompt_tokens=10,
        finish_reason="length",
        ended=ended if ended is not None else last,
    )
    r.error = error
    return r


def test_closed_point_counts_requests_ended_in_the_window_and_skips_those_cancelled() -> None:
    records = [
        _rec(0.0, 0.5, 1.5, 11),  # ended before the window
        _rec(1.0, 2.1, 3.1, 11),  # sent in the warm-up, first chunk and end inside: counted, TTFT 1.1 s
        _rec(2.0, 2.3, 4.3, 21),  # inside: ttft 0.3 s, itl 0.1 s
        _rec(2.5, 3.0, 3.2, 3),  # inside: ttft 0.5 s, itl 0.1 s
        _rec(3.0, 3.5, 4.0, 5, error="HTTP 500"),  # inside, failed
        _rec(4.0, 4.5, 5.5, 9, ended=12.5, error=CANCELLED_AT_END),  # cancelled at the end
    ]
    p = summarize_closed("s", 8, records, (2.0, 12.0), client_cpu=0.05, other_load=0.01)
    assert (p.mode, p.level, p.requests, p.errors, p.output_tokens) == (CLOSED, 8, 3, 1, 35)
    # streamed inside [2, 12]: 11 + 21 + 3 of those that ended, 9 of the one cancelled; not the failed one
    assert p.tokens_per_s == pytest.approx(4.4) and p.req_per_s == pytest.approx(0.3)
    assert p.extra["ended_tokens_per_s"] == pytest.approx(3.5)
    # TTFT: first chunk inside the window, the one cut at the end too (1.1, 0.3, 0.5, 0.5 s); not the
    # failed one, nor the first, whose first chunk came in the warm-up
    assert p.ttft_p50_ms == pytest.approx(500.0) and p.ttft_p99_ms == pytest.approx(1082.0)
    assert p.itl_p50_ms == pytest.approx(100.0)
    assert p.mean_output_tokens == 11.7 and p.mean_prompt_tokens == 10.0  # (11 + 21 + 3) / 3
    assert p.error_examples == ["HTTP 500"]


def test_closed_loop_tokens_are_those_streamed_in_the_window_whatever_the_waves_phase() -> None:
    # 4 clients in lockstep, 10 s per answer of 64 tokens: waves end at 10, 20, 30 s; 6.4 tokens/s each
    def waves(shift: float) -> list[StreamRecord]:
        return [
            _rec(w * 10.0 + shift, w * 10.0 + shift + 0.1, w * 10.0 + shift + 10.0, 64)
            for w in range(-1, 4)
            for _ in range(4)
        ]

    for shift in (0.0, 3.0, 4.0, 7.0):
        p = summarize_closed("s", 4, waves(shift), (5.0, 23.0))
        assert p.tokens_per_s == pytest.approx(4 * 64 / 10.0, rel=0.02)  # 25.6, the rate, at any phase
    ended = [summarize_closed("s", 4, waves(s), (5.0, 23.0)).extra["ended_tokens_per_s"] for s in (0.0, 4.0)]
    assert ended[0] != ended[1]  # what the count of ended requests would have said: 1 wave or 2
    one_chunk = _rec(0.0, 6.0, 6.0, 30, chunks=1)
    assert one_chunk.tokens_in(5.0, 7.0) == 30 and one_chunk.tokens_in(7.0, 9.0) == 0
    assert StreamRecord(sent=0.0).tokens_in(0.0, 1.0) == 0


def test_open_point_counts_arrivals_scheduled_in_the_window_and_judges_them() -> None:
    window = (10.0, 20.0)
    records = [_rec(5.0, 5.2, 6.0, 9)]  # warm-up
    records += [_rec(10.0 + i, 10.2 + i, 11.0 + i, 9) for i in range(8)]
    late = [0.0] * len(records)
    p = summarize_open("s", 1.0, records, late, window, peak_in_flight=2)
    assert p.mode == OPEN and p.requests == 8 and p.errors == 0 and p.extra["arrivals"] == 8
    assert p.extra["sustained"] and p.ttft_p50_ms == pytest.approx(200.0)
    failed = [*records, _rec(19.0, 19.5, 20.5, 9, ended=30.0, error=CANCELLED_AT_END)]
    p2 = summarize_open("s", 1.0, failed, [*late, 0.0], window)
    assert p2.errors == 1 and p2.extra["unfinished"] == 1 and not p2.extra["sustained"]
    # a growing backlog: TTFT 0.2 s at the start, 3 s at the end
    slow = [_rec(10.0 + i, 10.2 + i + (2.8 if i >= 8 else 0.0), 14.0 + i, 9) for i in range(10)]
    p3 = summarize_open("s", 1.0, slow, [0.0] * 10, window)
    assert not p3.extra["sustained"] and "backlog" in p3.extra["why"]
    # a backlog built in the warm-up: TTFT 12-20 s, growing by less than the backlog test sees; arrivals every
    # 0.5 s, one answer a second
    behind = [_rec(4.0 + i / 2, 10.0 + i, 10.5 + i, 9) for i in range(30)]
    p4 = summarize_open("s", 2.0, behind, [0.0] * 30, window)
    assert p4.extra["arrivals"] == 18 and p4.extra["answered"] == 10
    assert not p4.extra["sustained"] and "falling behind" in p4.extra["why"]
    unsent = summarize_open("s", 1.0, [StreamRecord(sent=11.0, error="unsent")], [float("inf")], window)
    assert unsent.extra["unsent"] == 1 and not judge_open(unsent)[0]


# ---- ratios ----


def _pt(system: str, level: float, tps: float, ttft99: float, mode: str = CLOSED) -> GenPoint:
    return GenPoint(system, mode, level, 60.0, 10, 0, int(tps * 60), tps, 1.0, ttft_p99_ms=ttft99)


def test_http_ratios_judge_throughput_at_8_and_32_and_ttft_everywhere() -> None:
    points = [
        _pt("service", 1, 30, 50),
        _pt("transformers-serve", 1, 25, 40),
        _pt("service", 8, 160, 200),
        _pt("transformers-serve", 8, 100, 400),
        _pt("service", 32, 200, 900),
        _pt("transformers-serve", 32, 150, 800),
        _pt("naive", 8, 20, 9000),
        _pt("service", 1.0, 50, 100, OPEN),
        _pt("transformers-serve", 1.0, 50, 200, OPEN),
    ]
    r = {x.name: x for x in http_ratios(points, "service", "transformers-serve", "naive")}
    c1 = r["output tokens/s service / transformers-serve, c=1"]
    assert c1.target == "context" and c1.met is None and c1.value == pytest.approx(1.2)
    assert r["output tokens/s service / transformers-serve, c=8"].met is True
    c32 = r["output tokens/s service / transformers-serve, c=32"]
    assert c32.met is False and c32.value == pytest.approx(200 / 150, abs=1e-3)
    assert r["TTFT p99 service / transformers-serve, closed loop c=8"].met is True
    assert r["TTFT p99 service / transformers-serve, closed loop c=32"].met is False
    assert r["TTFT p99 service / transformers-serve, open loop req/s=1"].value == pytest.approx(0.5)
    assert r["output tokens/s service / naive, c=8"].value == pytest.approx(8.0)
    assert "output tokens/s service / naive, c=1" not in r
    missing = http_ratios([_pt("transformers-serve", 8, 100, 400)], "service", "transformers-serve", "naive")
    assert missing and all(x.value is None and x.met is None for x in missing)
    assert http_ratios([_pt("naive", 8, 1, 1)], "service", "transformers-serve", "naive") == []


def test_design_ratios_against_the_designs_figures() -> None:
    rows = [
        DesignRow("no-cache", "", 12.0, 1, 100, 8.0),
        DesignRow("cache", "", 3.0, 1, 100, 2.0),
        DesignRow("batched-4", "", 4.5, 4, 100, 3.0),
    ]
    values = [r.value for r in design_ratios(rows)]
    assert values == [pytest.approx(4.0), pytest.approx(1.5)]
    assert all(r.target == "context" for r in design_ratios(rows))
    assert design_ratios(rows[:1]) == []


# ---- report ----


def _report() -> GenReport:
    rep = GenReport(
        command="python -m bench.generate --quick",
        machine={"git": "abc", "cpu_model": "cpu", "nproc": 2, "ram_gib": 8, "versions": "torch x"},
        options={"warmup_s": 2.0, "duration_s": 8.0},
        model={"describe": "tiny"},
        prompts={"count": 4, "tokens_min": 10, "tokens_max": 90},
        design_rows=[DesignRow("cache", "model.generate()", 2.0, 1, 100, 2.0)],
        systems=[SystemRun("service", "this | service", ran=False, note="did not start: no route")],
        points=[_pt("transformers-serve", 8, 100, 400), _pt("transformers-serve", 1.0, 40, 300, OPEN)],
    )
    rep.points[0].error_examples = ["HTTP 503"]
    rep.points[1].extra = {"drawn_req_per_s": 0.9, "sustained": False, "why": "2 of 9 failed"}
    rep.ratios = http_ratios(rep.points, "service", "transformers-serve", "naive")
    return rep


def test_render_has_every_table_and_escapes_pipes() -> None:
    text = generate_report.render(_report(), "plot.png")
    for heading in ("## The design's rows", "## Systems", "## Closed loop", "## Open loop", "## Ratios"):
        assert heading in text
    assert "this \\| service" in text and "HTTP 503" in text and "**no**: 2 of 9 failed" in text
    assert "| transformers-serve | 8 | 100.0 |" in text and "![" in text
    assert "### Systems" in generate_report.render(_report(), None, level=3)


def test_splice_doc_replaces_its_own_section_and_leaves_the_embedding_one() -> None:
    embedding = "<!-- bench:begin (x) -->\nold embedding\n<!-- bench:end -->"
    doc = f"# Benchmarks\n\n{embedding}\n"
    once = generate_report.splice_doc(doc, "first")
    assert embedding in once and once.count(generate_report.BEGIN_MARK) == 1 and "first" in once
    twice = generate_report.splice_doc(once + "\ntrailer\n", "second")
    assert "first" not in twice and "second" in twice and "trailer" in twice and embedding in twice


def test_report_round_trips_through_json_and_plots(tmp_path: Path) -> None:
    rep = _report()
    rep.save(tmp_path / "results.json")
    again = GenReport.load(tmp_path / "results.json")
    assert again == rep
    png = generate_report.plot(rep.points, tmp_path / "plot.png", "t")
    assert png.stat().st_size > 1000

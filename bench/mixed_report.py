"""The mixed-size workload (W4) in the report: its table by size class, which Infinity configuration is
the bar, and the service beside it (texts/s, small-request p99, errors)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.mixed import MIX, SMALL, WORKLOAD
from bench.openloop import sustained
from bench.openloop_report import verdict
from bench.results import Point, RunReport

Named = tuple[str, Point | None]  # a system's name and its point (None: missing)


def mixed_points(points: Sequence[Point]) -> list[Point]:
    return [p for p in points if p.workload == WORKLOAD]


def class_stats(p: Point, label: str) -> dict[str, Any]:
    return dict(p.setting.get("classes", {}).get(label, {}))


def small_p99(p: Point) -> float | None:
    value = class_stats(p, SMALL).get("p99_ms")
    return None if value is None else float(value)


def best_infinity(report: RunReport, kind: str = "infinity") -> Named:
    """Among the systems of ``kind`` with a W4 point: the one that sustained the offered rate, with the
    fewest errors, ties to the lower small-request p99 (all of them answer about the offered texts/s when
    they keep up). None measured: the last system of ``kind``, to say why it is missing."""
    names = [s.name for s in report.systems if s.kind == kind]
    candidates = [p for p in mixed_points(report.points) if p.system in names]
    if not candidates:
        return (names[-1] if names else f"any {kind} system", None)

    def key(p: Point) -> tuple[bool, int, float]:
        p99 = small_p99(p)
        return sustained(p), -p.errors, -(math.inf if p99 is None else p99)

    best = max(candidates, key=key)
    return best.system, best


def errors_cell(errors: int, by_status: dict[str, int] | None) -> str:
    """``0``, or the count and how they ended: ``3 (HTTP 503: 2, unanswered: 1)``."""
    if not errors:
        return "0"
    detail = ", ".join(f"{k}: {v}" for k, v in (by_status or {}).items())
    return f"{errors} ({detail})" if detail else str(errors)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _p99(stats: dict[str, Any]) -> str:
    low, high = stats.get("p99_low_ms"), stats.get("p99_high_ms")
    p99 = _num(stats.get("p99_ms"))
    return p99 if low is None or high is None else f"{p99} [{_num(low)}-{_num(high)}]"


def _rows(p: Point, with_round: bool) -> list[str]:
    """A point's rows: all its requests, then one per size class."""
    s = p.setting
    lead = f"| {p.system} |" + (f" {p.round} |" if with_round else "")
    other = "-" if p.other_load is None else f"{p.other_load * 100:.0f} %"
    everything = {"p99_ms": p.p99_ms, "p99_low_ms": p.p99_low_ms, "p99_high_ms": p.p99_high_ms}
    cells = [
        "all",
        str(s.get("arrivals", "-")),
        errors_cell(p.errors, s.get("errors_by_status")),
        _num(p.p50_ms),
        _p99(everything),
        f"{_num(p.seq_per_s)} of {_num(s.get('offered_texts_per_s'))}",
        f"{_num(p.req_per_s)} of {_num(s.get('drawn_req_per_s'))}",
        str(s.get("late", "-")),
        other,
        verdict(p),
    ]
    rows = [f"{lead} {' | '.join(cells)} |"]
    for c in MIX:
        st = class_stats(p, c.label)
        errors = errors_cell(int(st.get("errors", 0)), st.get("errors_by_status"))
        cells = [c.label, str(st.get("arrivals", "-")), errors, _num(st.get("p50_ms")), _p99(st)]
        rows.append(f"{lead} {' | '.join(cells)} | - | - | - | - | - |")
    return rows


def mixed_table(points: Sequence[Point], with_round: bool = False) -> str:
    """Per W4 point: all requests (texts answered per second of the window against those offered,
    requests likewise, late sends, other load, the verdict), then each size class (arrivals in the window,
    errors by status, p50, p99 with its 95 % interval)."""
    round_col = "| round " if with_round else ""
    lines = [
        f"| system {round_col}| texts per request | arrivals | errors | p50 ms | p99 ms "
        "| texts/s (of offered) | req/s (of drawn) | late | other load | sustained |",
        "|" + "---|" * (12 if with_round else 11),
    ]
    for p in mixed_points(points):
        lines += _rows(p, with_round)
    return "\n".join(lines)


def side_by_side(report: RunReport, service_names: Sequence[str]) -> str:
    """Per round and service variant, its W4 figures beside those of Infinity's best W4 configuration of
    that round (``best_infinity``): texts/s, small-request p99, errors, and the two ratios."""
    lines = [
        "| round | system | texts/s | 1-4 p99 ms | errors | Infinity | texts/s | 1-4 p99 ms | errors "
        "| texts/s ÷ | 1-4 p99 ÷ |",
        "|" + "---|" * 11,
    ]
    for round_no in range(1, report.rounds + 1):
        rep = report.in_round(round_no)
        inf_name, inf = best_infinity(rep)
        for name in service_names:
            mine = rep.point(name, WORKLOAD)
            if mine is None and inf is None:
                continue
            cells = []
            for p in (mine, inf):
                cells += [
                    _num(p.seq_per_s if p else None),
                    _num(small_p99(p) if p else None),
                    errors_cell(p.errors, p.setting.get("errors_by_status")) if p else "-",
                ]
            texts = _ratio(mine.seq_per_s if mine else None, inf.seq_per_s if inf else None)
            p99 = _ratio(small_p99(mine) if mine else None, small_p99(inf) if inf else None)
            lines.append(
                f"| {round_no} | {name} | {' | '.join(cells[:3])} | {inf_name} | {' | '.join(cells[3:])} "
                f"| {texts} | {p99} |"
            )
    return "\n".join(lines)


def _g(value: object) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "?"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def mixed_section(report: RunReport, heading: str, service_names: Sequence[str]) -> list[str]:
    """The W4 part of the markdown report (nothing when the run measured no W4)."""
    points = mixed_points(report.points)
    if not points:
        return []
    s = points[0].setting
    rate, bound = s.get("offered_req_per_s"), s.get("p99_bound_ms")
    return [
        heading,
        "",
        f"Requests of mixed sizes: {s.get('mix', '')}, texts drawn at random from the corpus, arriving as a "
        f"Poisson process at {_g(rate)} req/s (open loop, as W3); latency from the "
        "scheduled time to the answer; texts/s: texts answered inside the window per second of it. Errors: "
        "any non-200 answer, wrong embedding count, client failure, unanswered at the drain deadline. "
        f"Sustained: W3's rules, with p99 of all requests <= {_g(bound)} ms "
        "(bench/README.md).",
        "",
        mixed_table(points, with_round=report.rounds > 1),
        "",
        "Beside Infinity's best W4 configuration of each round (sustained, fewest errors, lowest 1-4 p99); "
        "targets: texts/s ≥ Infinity's, 1-4-text p99 ≤ Infinity's, no errors where Infinity has none "
        '(judged in "Ratios").',
        "",
        side_by_side(report, service_names),
        "",
    ]

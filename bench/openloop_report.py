"""The open-loop workload (W3) in the report: its table, and which Infinity configuration is the bar."""

from __future__ import annotations

from collections.abc import Sequence

from bench.openloop import WORKLOAD, sustained
from bench.results import Point, RunReport

Named = tuple[str, Point | None]  # a system's name and a point of it (None: missing)


def open_loop_points(points: Sequence[Point]) -> list[Point]:
    return [p for p in points if p.workload == WORKLOAD]


def best_sustaining(report: RunReport, kind: str = "infinity") -> Named:
    """Among the systems of ``kind`` with open-loop points: the one that sustained the highest offered
    rate (ties: the lower p99 at that rate), as its name and that point. No such system: the last of
    ``kind`` (to say why it is missing), or a placeholder name."""
    names = [s.name for s in report.systems if s.kind == kind]
    best: tuple[tuple[int, float], Point] | None = None
    for name in names:
        mine = sorted(
            (p for p in open_loop_points(report.points) if p.system == name), key=lambda p: p.concurrency
        )
        if not mine:
            continue
        held = [p for p in mine if sustained(p)]
        top = held[-1] if held else mine[0]
        key = (top.concurrency if held else 0, -(top.p99_ms if top.p99_ms is not None else float("inf")))
        if best is None or key > best[0]:
            best = (key, top)
    if best is None:
        return (names[-1] if names else f"any {kind} system", None)
    return best[1].system, best[1]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def verdict(p: Point) -> str:
    if "sustained" not in p.setting:
        return "-"
    return "yes" if sustained(p) else f"**no**: {p.setting.get('why', '')}".replace("|", "\\|")


def open_loop_table(points: Sequence[Point], with_round: bool = False) -> str:
    """One row per open-loop point: offered rate (nominal, and as drawn in the window), achieved
    throughput, latency, failures, how late the client was, the peak in flight, and the verdict."""
    round_col = "| round " if with_round else ""
    lines = [
        f"| system {round_col}| offered req/s | drawn req/s | achieved req/s | p50 ms | p99 ms | errors "
        "| late | peak in flight | client CPU | other load | sustained |",
        "|" + "---|" * (13 if with_round else 12),
    ]
    for p in open_loop_points(points):
        s = p.setting
        cpu = "-" if p.client_cpu is None else f"{p.client_cpu * 100:.0f} %"
        other = "-" if p.other_load is None else f"{p.other_load * 100:.0f} %"
        cell = f" {p.round} |" if with_round else ""
        errors = f"{p.errors} of {s.get('arrivals', '?')}"
        lines.append(
            f"| {p.system} |{cell} {p.concurrency} | {_num(s.get('drawn_req_per_s'))} | {_num(p.req_per_s)} "
            f"| {_num(p.p50_ms)} | {_p99(p)} | {errors} | {s.get('late', '-')} "
            f"| {s.get('peak_in_flight', '-')} | {cpu} | {other} | {verdict(p)} |"
        )
    return "\n".join(lines)


def _p99(p: Point) -> str:
    """The p99 and, in brackets, where it lies with 95 % confidence (none: too few answers to say)."""
    if p.p99_low_ms is None or p.p99_high_ms is None:
        return _num(p.p99_ms)
    return f"{_num(p.p99_ms)} [{_num(p.p99_low_ms)}-{_num(p.p99_high_ms)}]"


def open_loop_row(p: Point) -> str:
    """One point as a row of ``open_loop_table`` (printed as each point is measured)."""
    return open_loop_table([p]).splitlines()[-1]


def open_loop_section(report: RunReport, heading: str, plot_name: str | None) -> list[str]:
    """The open-loop part of the markdown report (nothing when the run measured no open loop)."""
    points = open_loop_points(report.points)
    if not points:
        return []
    bound = points[0].setting.get("p99_bound_ms", "?")
    parts = [
        heading,
        "",
        "Single texts of mixed length from the corpus, arriving as a Poisson process at each offered rate "
        "(each sent on its own schedule, whether or not earlier ones were answered); latency from the "
        "scheduled time to the answer, throughput the answers received in the window; in brackets, where "
        "the p99 lies with 95 % confidence (bench/results.py, percentile_interval). Sustained: "
        f"achieved >= 95 % of the rate drawn, <= 1 % failed, p99 <= {bound} ms, no growing backlog, client "
        "on schedule (bench/README.md).",
        "",
        open_loop_table(points, with_round=report.rounds > 1),
    ]
    if plot_name:
        parts += ["", f"![open loop: latency against offered rate]({plot_name})"]
    return [*parts, ""]

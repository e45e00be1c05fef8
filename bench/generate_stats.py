"""Figures of ``python -m bench.generate``: points from stream records, the ratios, and the report data.

A closed-loop point counts the requests that ended inside the measured window (as ``bench.loadgen``
does) for its requests, req/s and inter-token latency (ITL), and those sent inside it for its TTFT (a
stream cut at the window's end too, once its first chunk came). Its output tokens/s is the tokens streamed
inside the window (``StreamRecord.tokens_in``): with a fixed ``max_tokens`` a continuous batch's clients
start and end together, wave after wave, and the requests that ended in a window of one or two waves swing
with the phase (``extra["ended_tokens_per_s"]`` keeps that count). An open-loop point counts the arrivals
scheduled inside the window: its latencies run from the scheduled time; arrivals unanswered at the drain
deadline or never sent are failures.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.generate_load import CANCELLED_AT_END, StreamRecord
from bench.results import percentile

CLOSED, OPEN = "closed", "open"
LATE_AFTER_S = 0.05  # an open-loop arrival sent later than this behind schedule is "late"
MAX_FAILED = 0.01  # open loop: at most this share of the window's arrivals may fail to be sustained
BACKLOG_FACTOR, BACKLOG_SLACK_S = 2.0, 0.5  # last quarter's TTFT p50 over 2x the first's + 0.5 s: growing
# Answered in the window at least this share of the window's arrivals (less KEEP_UP_SLACK requests): a backlog
# built in the warm-up can hold the TTFT steady (high) through the window, and only this shows it.
KEEP_UP, KEEP_UP_SLACK = 0.85, 2
DESIGN = {"no_cache_s": 8.0, "cache_s": 2.0, "batched_s": 3.0}  # the design's 4 x 100 tokens figures


@dataclass
class GenPoint:
    system: str
    mode: str  # "closed" (level: concurrency) or "open" (level: offered req/s)
    level: float
    duration_s: float
    requests: int  # successful requests counted in the window
    errors: int
    output_tokens: int
    tokens_per_s: float
    req_per_s: float
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    gap_p99_ms: float | None = None  # p99 over requests of the longest gap between two content chunks
    mean_prompt_tokens: float | None = None  # as the server counted them (usage), chat template included
    mean_output_tokens: float | None = None
    usage_missing: int = 0  # answers without usage: their content chunks counted as tokens
    client_cpu: float | None = None
    other_load: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    round: int = 1  # of a run of several rounds (bench/generate_rounds.py); 0: a median over rounds
    workload: str = "mix"  # bench/generate_workloads.py ("mix": the single prompt mix of earlier runs)


def _ms(values: Sequence[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000.0, 1) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def _latency_fields(
    good: Sequence[StreamRecord],
    timed: Sequence[StreamRecord] | None = None,
    first: Sequence[StreamRecord] | None = None,
) -> dict[str, Any]:
    """Latency percentiles over ``timed`` (default ``good``; TTFT over ``first`` where given), token means
    over ``good``."""
    timed = good if timed is None else timed
    ttft = [r.ttft for r in (timed if first is None else first) if r.ttft is not None]
    itl = [r.itl for r in timed if r.itl is not None]
    gaps = [r.max_gap for r in timed if r.chunks > 1]
    return {
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "itl_p50_ms": _ms(itl, 50),
        "itl_p99_ms": _ms(itl, 99),
        "gap_p99_ms": _ms(gaps, 99),
        "mean_prompt_tokens": _mean([r.prompt_tokens for r in good if r.prompt_tokens is not None]),
        "mean_output_tokens": _mean([r.tokens for r in good]),
        "usage_missing": sum(1 for r in good if r.usage_missing),
    }


def _examples(records: Sequence[StreamRecord]) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r.error and r.error not in seen:
            seen.append(r.error)
        if len(seen) >= 5:
            break
    return seen


def summarize_closed(
    system: str,
    concurrency: int,
    records: Sequence[StreamRecord],
    window: tuple[float, float],
    client_cpu: float | None = None,
    other_load: float | None = None,
) -> GenPoint:
    lo, hi = window
    duration = hi - lo
    ended = [
        r for r in records if r.ended is not None and lo <= r.ended <= hi and r.error != CANCELLED_AT_END
    ]
    good = [r for r in ended if r.ok]
    bad = [r for r in ended if not r.ok]
    tokens = sum(r.tokens for r in good)
    streamed = sum(r.tokens_in(lo, hi) for r in records if r.ok or r.error == CANCELLED_AT_END)
    # TTFT of the requests whose first chunk came inside the window, those cut at its end too. The window
    # opens once every client has had its first answer, so the warm-up's burst (every client's first request
    # at once, which no later request sees) is left out; a server that answers in waves (every client's
    # request sent and ended together) still has each wave's first chunks counted. ITL and gaps: of the
    # answers that ended in the window.
    started = [
        r
        for r in records
        if r.first is not None and lo <= r.first <= hi and (r.ok or r.error == CANCELLED_AT_END)
    ]
    return GenPoint(
        system=system,
        mode=CLOSED,
        level=concurrency,
        duration_s=round(duration, 2),
        requests=len(good),
        errors=len(bad),
        output_tokens=tokens,
        tokens_per_s=round(streamed / duration, 2) if duration > 0 else 0.0,
        req_per_s=round(len(good) / duration, 3) if duration > 0 else 0.0,
        client_cpu=None if client_cpu is None else round(client_cpu, 3),
        other_load=None if other_load is None else round(other_load, 3),
        extra={"ended_tokens_per_s": round(tokens / duration, 2) if duration > 0 else 0.0},
        error_examples=_examples(bad),
        **_latency_fields(good, good, started),
    )


def summarize_open(
    system: str,
    rate: float,
    records: Sequence[StreamRecord],
    lateness: Sequence[float],
    window: tuple[float, float],
    client_cpu: float | None = None,
    other_load: float | None = None,
    peak_in_flight: int = 0,
) -> GenPoint:
    lo, hi = window
    duration = hi - lo
    inside = [(r, late) for r, late in zip(records, lateness, strict=True) if lo <= r.sent < hi]
    arrivals = [r for r, _ in inside]
    good = [r for r in arrivals if r.ok]
    bad = [r for r in arrivals if not r.ok]
    answered = [r for r in records if r.ok and r.ended is not None and lo <= r.ended < hi]
    tokens = sum(r.tokens for r in answered)
    quarter = duration / 4
    first = [r.ttft for r in good if r.ttft is not None and r.sent < lo + quarter]
    last = [r.ttft for r in good if r.ttft is not None and r.sent >= hi - quarter]
    extra = {
        "offered_req_per_s": rate,
        "arrivals": len(arrivals),
        "answered": len(answered),
        "drawn_req_per_s": round(len(arrivals) / duration, 3) if duration > 0 else 0.0,
        "unfinished": sum(1 for r in bad if r.error == CANCELLED_AT_END),
        "unsent": sum(1 for _, late in inside if late == float("inf")),
        "late": sum(1 for _, late in inside if LATE_AFTER_S < late < float("inf")),
        "peak_in_flight": peak_in_flight,
        "ttft_p50_first_quarter_s": round(statistics.median(first), 3) if first else None,
        "ttft_p50_last_quarter_s": round(statistics.median(last), 3) if last else None,
    }
    point = GenPoint(
        system=system,
        mode=OPEN,
        level=rate,
        duration_s=round(duration, 2),
        requests=len(good),
        errors=len(bad),
        output_tokens=tokens,
        tokens_per_s=round(tokens / duration, 2) if duration > 0 else 0.0,
        req_per_s=round(len(answered) / duration, 3) if duration > 0 else 0.0,
        client_cpu=None if client_cpu is None else round(client_cpu, 3),
        other_load=None if other_load is None else round(other_load, 3),
        extra=extra,
        error_examples=_examples(bad),
        **_latency_fields(good),
    )
    sustained, why = judge_open(point)
    point.extra.update(sustained=sustained, why=why)
    return point


def judge_open(p: GenPoint) -> tuple[bool, str]:
    """Sustained: at most 1 % of the window's arrivals failed, no growing backlog (the TTFT median of the
    window's last quarter at most 2x the first quarter's + 0.5 s), and the window's answers keep up with its
    arrivals (at least 85 % of them, less 2)."""
    arrivals = int(p.extra.get("arrivals", 0))
    if arrivals == 0:
        return False, "no arrivals in the window"
    if p.errors > MAX_FAILED * arrivals:
        return False, f"{p.errors} of {arrivals} failed or unfinished"
    first, last = p.extra.get("ttft_p50_first_quarter_s"), p.extra.get("ttft_p50_last_quarter_s")
    if first is not None and last is not None and last > BACKLOG_FACTOR * first + BACKLOG_SLACK_S:
        return False, f"backlog growing: TTFT p50 {first} s in the first quarter, {last} s in the last"
    answered = p.extra.get("answered")
    if answered is not None and answered < KEEP_UP * arrivals - KEEP_UP_SLACK:
        return False, f"falling behind: {answered} answered in the window against {arrivals} arrivals"
    return True, ""


@dataclass
class DesignRow:
    name: str  # "no-cache", "cache", "batched-4"
    what: str
    seconds: float
    requests: int
    new_tokens: int  # per request
    design_s: float | None = None
    other_load: float | None = None  # CPU used by other processes meanwhile, share of all CPUs


@dataclass
class GenRatio:
    name: str
    value: float | None
    target: str  # ">= 1.5", "<= 1.0", or "context"
    met: bool | None
    detail: str


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def design_ratios(rows: Sequence[DesignRow]) -> list[GenRatio]:
    """The design's two claims against this machine: the KV cache's speed-up (design 8 s / 2 s = 4x) and
    4 batched requests' time over one request's (design 3 s / 2 s = 1.5x)."""
    by = {r.name: r for r in rows}
    out = []
    if "no-cache" in by and "cache" in by:
        value = _ratio(by["no-cache"].seconds, by["cache"].seconds)
        out.append(
            GenRatio(
                "KV cache speed-up: no-cache s / cache s",
                value,
                "context",
                None,
                f"design {DESIGN['no_cache_s'] / DESIGN['cache_s']:.1f}x",
            )
        )
    if "batched-4" in by and "cache" in by:
        value = _ratio(by["batched-4"].seconds, by["cache"].seconds)
        out.append(
            GenRatio(
                "4 batched requests s / 1 request s (model.generate)",
                value,
                "context",
                None,
                f"design {DESIGN['batched_s'] / DESIGN['cache_s']:.1f}x; 4.0 = no batching gain",
            )
        )
    return out


def find(
    points: Sequence[GenPoint], system: str, mode: str, level: float, workload: str | None = None
) -> GenPoint | None:
    for p in points:
        if (p.system, p.mode, p.level) == (system, mode, level) and workload in (None, p.workload):
            return p
    return None


@dataclass
class SystemRun:
    name: str
    what: str
    ran: bool = False
    note: str = ""  # why it did not run, the output check, start time
    start_s: float | None = None


@dataclass
class GenReport:
    command: str
    machine: dict[str, Any]
    options: dict[str, Any]
    model: dict[str, Any]
    prompts: dict[str, Any]
    design_rows: list[DesignRow] = field(default_factory=list)
    systems: list[SystemRun] = field(default_factory=list)
    points: list[GenPoint] = field(default_factory=list)
    ratios: list[GenRatio] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2, default=str) + "\n")

    @classmethod
    def load(cls, path: Path) -> GenReport:
        raw = json.loads(path.read_text())
        return cls(
            **{k: raw[k] for k in ("command", "machine", "options", "model", "prompts")},
            design_rows=[DesignRow(**r) for r in raw["design_rows"]],
            systems=[SystemRun(**s) for s in raw["systems"]],
            points=[GenPoint(**p) for p in raw["points"]],
            ratios=[GenRatio(**r) for r in raw["ratios"]],
            started_at=raw.get("started_at", ""),
            finished_at=raw.get("finished_at", ""),
        )

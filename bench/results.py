"""Result records of a benchmark run, percentiles, and their JSON form."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0-100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentile_interval(
    values: Sequence[float], q: float, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Where the q-th percentile of the distribution the values were drawn from lies, with ``confidence``:
    two of the sorted values, with no assumption on the distribution. How many values fall below the true
    percentile is binomial (n, q/100), so the ranks n*p -/+ z*sqrt(n*p*(1-p)), rounded outward, bound it
    (normal approximation): for a p99 from 1000 answers, the 18th and the 4th slowest; from 200, no upper
    bound (None). Answers under load are not independent (a burst slows several at once), so the interval
    is if anything too narrow: where two systems' intervals overlap, the run cannot tell them apart."""
    n, p = len(values), q / 100.0
    if not 0.0 < p < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"percentile {q} or confidence {confidence} is outside (0, 100) or (0, 1)")
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n * p * (1.0 - p))
    low, high = math.floor(n * p - half), math.ceil(n * p + half)  # 1-based ranks
    if low < 1 or high > n:
        return None
    ordered = sorted(values)
    return ordered[low - 1], ordered[high - 1]


@dataclass(frozen=True)
class Point:
    """One measured point: a system under one workload at one concurrency."""

    system: str
    workload: str  # "W1", "W2", "ramp", "tune", or "b1" / "b32-sorted" for in-process rows
    concurrency: int
    texts_per_request: int
    duration_s: float
    requests: int  # successful requests completed in the measurement window
    errors: int
    req_per_s: float
    seq_per_s: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    client_cpu: float | None = None  # load generator CPU, fraction of one core
    other_load: float | None = None  # CPU used by anything else on the machine, share of all CPUs
    setting: dict[str, Any] = field(default_factory=dict)  # tuner: the user_config measured
    round: int = 1  # which start of its system (``bench run --rounds``); in-process rows: always 1
    # Where the p99 lies with 95 % confidence (``percentile_interval``); None: too few answers to bound it.
    p99_low_ms: float | None = None
    p99_high_ms: float | None = None

    @property
    def error_rate(self) -> float:
        total = self.requests + self.errors
        return self.errors / total if total else 0.0


def summarize(
    system: str,
    workload: str,
    concurrency: int,
    texts_per_request: int,
    duration_s: float,
    latencies_s: Sequence[float],
    errors: int,
    client_cpu: float | None = None,
    setting: dict[str, Any] | None = None,
    other_load: float | None = None,
) -> Point:
    """A Point from the latencies (seconds) of the successful requests completed in the window."""
    n = len(latencies_s)

    def ms(q: float) -> float | None:
        return round(percentile(latencies_s, q) * 1000.0, 2) if n else None

    rate = n / duration_s if duration_s > 0 else 0.0
    bounds = percentile_interval(latencies_s, 99) if n else None
    low, high = (None, None) if bounds is None else (round(bounds[0] * 1e3, 2), round(bounds[1] * 1e3, 2))
    return Point(
        system=system,
        workload=workload,
        concurrency=concurrency,
        texts_per_request=texts_per_request,
        duration_s=round(duration_s, 3),
        requests=n,
        errors=errors,
        req_per_s=round(rate, 2),
        seq_per_s=round(rate * texts_per_request, 2),
        p50_ms=ms(50),
        p90_ms=ms(90),
        p99_ms=ms(99),
        client_cpu=None if client_cpu is None else round(client_cpu, 3),
        other_load=None if other_load is None else round(other_load, 3),
        setting=dict(setting or {}),
        p99_low_ms=low,
        p99_high_ms=high,
    )


@dataclass
class SystemInfo:
    """A system the run meant to measure: what it is, whether it ran, and why not."""

    name: str
    kind: str  # "inprocess", "service", "naive", "infinity"
    description: str
    ran: bool = False
    reason: str = ""  # why it did not run, or what went wrong
    check_min_cosine: float | None = None  # lowest cosine of its embeddings vs the reference


# In-process rows named b<N>-requests run W2's own requests through the model alone (bench.inprocess).
REQUESTS_SUFFIX = "-requests"


def is_same_requests_row(workload: str) -> bool:
    return workload.endswith(REQUESTS_SUFFIX)


@dataclass
class Ratio:
    name: str
    value: float | None
    target: str
    met: bool | None
    detail: str


@dataclass
class RunReport:
    command: str
    machine: dict[str, Any]
    options: dict[str, Any]
    corpus: dict[str, Any]
    systems: list[SystemInfo] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""

    def system(self, name: str) -> SystemInfo | None:
        return next((s for s in self.systems if s.name == name), None)

    def point(self, system: str, workload: str, concurrency: int | None = None) -> Point | None:
        for p in self.points:
            if p.system == system and p.workload == workload and concurrency in (None, p.concurrency):
                return p
        return None

    @property
    def rounds(self) -> int:
        return max((p.round for p in self.points), default=1)

    def in_round(self, round_no: int) -> RunReport:
        """The run as if it had only this round of the HTTP systems (the in-process rows are shared)."""
        inprocess = {s.name for s in self.systems if s.kind == "inprocess"}
        points = [p for p in self.points if p.round == round_no or p.system in inprocess]
        return replace(self, points=points, ratios=[])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)  # paths nested in options

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> RunReport:
        raw = json.loads(path.read_text())
        return cls(
            command=raw["command"],
            machine=raw["machine"],
            options=raw["options"],
            corpus=raw["corpus"],
            systems=[SystemInfo(**s) for s in raw["systems"]],
            points=[Point(**p) for p in raw["points"]],
            ratios=[Ratio(**r) for r in raw["ratios"]],
            started_at=raw.get("started_at", ""),
            finished_at=raw.get("finished_at", ""),
        )


def retry_disturbed(
    measure_once: Callable[[], tuple[Point, list[str]]], max_other_load: float, retries: int
) -> tuple[Point, list[str], int]:
    """Measure; while other processes used more than ``max_other_load`` of the machine during the
    window, measure again (at most ``retries`` more times). Returns the least disturbed point, its
    error examples, and how many measurements were taken."""
    best = measure_once()
    taken = 1
    while taken <= retries and (best[0].other_load or 0.0) > max_other_load:
        again = measure_once()
        taken += 1
        if (again[0].other_load or 0.0) < (best[0].other_load or 0.0):
            best = again
    return best[0], best[1], taken

"""Mixed request sizes, open loop (workload W4): Poisson arrivals of requests of 1-4, 32 or 256 texts.

Real traffic is long-tailed: most requests carry a text or a few, some a page of 32, a few a bulk job of 256
(the most a request may hold: the service's ``limits.max_inputs_per_request``). W4 draws each arrival's size
from ``MIX`` (80 % 1-4 texts, uniform; 17 % 32; 3 % 256: 15.1 texts per request on average) and its texts at
random from the whole corpus (mixed lengths), seeded; the arrivals are a Poisson process at one offered
rate, sent by the open-loop driver of W3 (``bench.openloop``: ``poisson_schedule``, ``drive``,
``summarize_open_loop``, ``judge``). Per size class: arrivals, errors by status, p50 and p99
(``summarize_mixed``); overall: texts answered per second of the window. Whether the system kept up is
W3's verdict on the whole point (``openloop.judged``) with its own p99 bound (a 256-text request alone
takes seconds on some systems).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench import openloop
from bench.loadgen import Requests, Target, Timing, encode_requests
from bench.openloop import Arrival, Drive
from bench.results import Point, summarize

WORKLOAD = "W4"
MAX_TEXTS = 256  # the most one request may hold (the service's limits.max_inputs_per_request)
MAX_RATE = 50.0  # req/s: bounds the arrivals (and bodies encoded up front) of one window
MAX_WINDOW_S = 900.0  # the longest measured window, whatever --mixed-requests asks for
SEED_OFFSET = 4_000  # W4's schedules differ from W3's at the same seed


@dataclass(frozen=True)
class SizeClass:
    """Requests of ``low``-``high`` texts (uniform), drawn with probability ``weight``."""

    label: str
    low: int
    high: int
    weight: float

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


MIX = (SizeClass("1-4", 1, 4, 0.80), SizeClass("32", 32, 32, 0.17), SizeClass("256", 256, 256, 0.03))
SMALL = MIX[0].label  # the class whose p99 is held against Infinity's


def mean_texts(mix: Sequence[SizeClass] = MIX) -> float:
    """Texts per request on average: the offered texts/s is this times the request rate."""
    return sum(c.weight * c.mean for c in mix) / sum(c.weight for c in mix)


def describe(mix: Sequence[SizeClass] = MIX) -> str:
    parts = ", ".join(f"{c.weight:.0%} {c.label}" for c in mix)
    return f"{parts} texts per request ({mean_texts(mix):.1f} on average)"


def draw_sizes(n: int, seed: int, mix: Sequence[SizeClass] = MIX) -> list[int]:
    """The number of texts of each of ``n`` arrivals: a class by its weight, then uniform within it."""
    if any(c.high > MAX_TEXTS or c.low < 1 or c.low > c.high for c in mix):
        raise ValueError(f"class sizes must lie within 1-{MAX_TEXTS}: {mix}")
    rng = random.Random(seed ^ 0x512E)
    classes = rng.choices(list(mix), weights=[c.weight for c in mix], k=n)
    return [rng.randint(c.low, c.high) for c in classes]


def size_class(n: int, mix: Sequence[SizeClass] = MIX) -> str:
    return next(c.label for c in mix if c.low <= n <= c.high)


def compose(sizes: Sequence[int], texts: Sequence[str], seed: int) -> list[list[str]]:
    """Each request's texts: ``size`` distinct corpus texts drawn at random (seeded), so every size
    carries the corpus's mix of lengths."""
    if sizes and max(sizes) > len(texts):
        raise ValueError(f"a request of {max(sizes)} texts needs as many corpus texts, got {len(texts)}")
    rng = random.Random(seed ^ 0x7E47)
    return [rng.sample(texts, k) for k in sizes]


def encode(target: Target, groups: Sequence[Sequence[str]]) -> Requests:
    """One pre-encoded body per arrival (``loadgen.encode_requests``'s payload), with its text count."""
    bodies = [encode_requests(target, [g]).bodies[0] for g in groups]
    counts = tuple(len(g) for g in groups)
    return Requests(tuple(bodies), counts, round(mean_texts()))


def status(a: Arrival) -> str:
    """How one arrival ended: ``200``, ``HTTP <code>``, ``bad body`` (wrong embedding count), the client
    exception's name, ``unanswered`` (cancelled at the drain deadline) or ``unsent`` (in-flight bound)."""
    if a.sent is None:
        return "unsent"
    if a.ok:
        return "200"
    if a.done is None:
        return "unanswered"
    head = a.problem.partition(":")[0].strip()
    return "bad body" if head.startswith("expected ") else head or "failed"


def _class_stats(
    system: str, arrivals: Sequence[Arrival], sizes: Sequence[int], timing: Timing
) -> dict[str, Any]:
    """One size class of the window: arrivals, errors (and by status), p50, p99 and its 95 % interval."""
    good = [a.done - a.scheduled for a in arrivals if a.ok and a.done is not None]
    p = summarize(system, WORKLOAD, 0, 1, timing.duration_s, good, len(arrivals) - len(good))
    by_status = Counter(status(a) for a in arrivals if not a.ok)
    return {
        "arrivals": len(arrivals),
        "texts": sum(sizes),
        "errors": p.errors,
        "errors_by_status": dict(sorted(by_status.items())),
        "p50_ms": p.p50_ms,
        "p99_ms": p.p99_ms,
        "p99_low_ms": p.p99_low_ms,
        "p99_high_ms": p.p99_high_ms,
    }


def summarize_mixed(
    system: str,
    rate: float,
    result: Drive,
    sizes: Sequence[int],
    timing: Timing,
    client_cpu: float | None = None,
    mix: Sequence[SizeClass] = MIX,
) -> Point:
    """W3's summary of the window (``openloop.summarize_open_loop``: all arrivals together), with texts
    answered per second of the window as ``seq_per_s``, and per size class the arrivals scheduled in the
    window: count, errors by status, p50 and p99 (``setting["classes"]``)."""
    if len(sizes) != len(result.arrivals):
        raise ValueError(f"{len(sizes)} sizes for {len(result.arrivals)} arrivals")
    base = openloop.summarize_open_loop(system, 0, result, timing, client_cpu)
    lo, hi = timing.warmup_s, timing.warmup_s + timing.duration_s
    pairs = list(zip(result.arrivals, sizes, strict=True))
    window = [(a, n) for a, n in pairs if lo <= a.scheduled < hi]
    answered = sum(n for a, n in pairs if a.ok and a.done is not None and lo <= a.done < hi)
    classes: dict[str, Any] = {}
    for c in mix:
        mine = [(a, n) for a, n in window if c.low <= n <= c.high]
        classes[c.label] = _class_stats(system, [a for a, _ in mine], [n for _, n in mine], timing)
    setting = {
        **base.setting,
        "offered_req_per_s": rate,
        "mix": describe(mix),
        "offered_texts_per_s": round(sum(n for _, n in window) / timing.duration_s, 2),
        "texts_per_s": round(answered / timing.duration_s, 2),
        "errors_by_status": dict(sorted(Counter(status(a) for a, _ in window if not a.ok).items())),
        "classes": classes,
    }
    texts_per_s = setting["texts_per_s"]
    return replace(
        base,
        workload=WORKLOAD,
        texts_per_request=round(mean_texts(mix)),
        seq_per_s=texts_per_s,
        setting=setting,
    )


def window_s(rate: float, duration_s: float, min_requests: int) -> float:
    """W3's window (``duration_s``, longer to hold ``min_requests`` arrivals), at most ``MAX_WINDOW_S``."""
    return min(openloop.window_s(rate, duration_s, min_requests), max(duration_s, MAX_WINDOW_S))


def measure(
    system: str,
    target: Target,
    texts: Sequence[str],
    rate: float,
    timing: Timing,
    seed: int,
    p99_bound_ms: float,
    server_session: int | None = None,
) -> tuple[Point, list[str]]:
    """One W4 point at ``rate`` req/s of mixed sizes (warm-up arrivals sent, not counted), judged
    sustained or not by W3's rules with ``p99_bound_ms`` on the p99 of all its requests."""
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate must be within (0, {MAX_RATE:g}] req/s, got {rate}")
    seed = seed + SEED_OFFSET + round(rate * 1000)
    schedule = openloop.poisson_schedule(rate, timing.warmup_s + timing.duration_s, seed)
    sizes = draw_sizes(len(schedule), seed)
    requests = encode(target, compose(sizes, texts, seed))
    picks = list(range(len(schedule)))
    result, cpu, other = openloop.run_schedule(target, requests, schedule, picks, timing, server_session)
    point = summarize_mixed(system, rate, result, sizes, timing, client_cpu=cpu)
    return openloop.judged(replace(point, other_load=other), p99_bound_ms), result.problems

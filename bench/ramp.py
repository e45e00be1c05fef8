"""``python -m bench ramp``: raise concurrency step by step on one system and find the knee.

The ramp stops when p99 passes the target, errors pass the limit (1 % by default), or the step or
concurrency bound is reached. The knee is the last step before throughput flattens: the first point
whose next step adds less than ``min_gain`` (10 %) throughput; past it, more concurrency only buys
latency. The best point within the p99 target is reported beside it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import loadgen, report, systems
from bench.cli import Options
from bench.results import Point, retry_disturbed
from bench.runner import WORK_DIR, ensure_work_dir, prepare_corpus, servers
from deployments.tools.corpus import batches


@dataclass(frozen=True)
class RampOutcome:
    points: list[Point]
    stop_reason: str
    knee: Point | None
    best_within_target: Point | None


def next_concurrency(current: int, factor: float) -> int:
    return max(current + 1, round(current * factor))


def concurrency_steps(start: int, factor: float, maximum: int, max_steps: int) -> list[int]:
    steps = []
    c = start
    while c <= maximum and len(steps) < max_steps:
        steps.append(c)
        c = next_concurrency(c, factor)
    return steps


def stop_reason(point: Point, p99_target_ms: float, max_error_rate: float) -> str:
    """Why the ramp must stop after ``point`` ("" to go on)."""
    if point.error_rate > max_error_rate:
        return f"errors {point.error_rate:.1%} > {max_error_rate:.0%} at c={point.concurrency}"
    if point.p99_ms is None:
        return f"no successful request at c={point.concurrency}"
    if point.p99_ms > p99_target_ms:
        return f"p99 {point.p99_ms:.0f} ms > target {p99_target_ms:.0f} ms at c={point.concurrency}"
    return ""


def find_knee(points: Sequence[Point], min_gain: float = 0.1) -> Point | None:
    """The first point after which the next step raises throughput (seq/s) by less than ``min_gain``."""
    if not points:
        return None
    for here, nxt in itertools.pairwise(points):
        if here.seq_per_s <= 0 or (nxt.seq_per_s - here.seq_per_s) / here.seq_per_s < min_gain:
            return here
    return points[-1]


def best_within(points: Sequence[Point], p99_target_ms: float, max_error_rate: float) -> Point | None:
    ok = [
        p
        for p in points
        if p.p99_ms is not None and p.p99_ms <= p99_target_ms and p.error_rate <= max_error_rate
    ]
    return max(ok, key=lambda p: p.seq_per_s, default=None)


def render(outcome: RampOutcome, opts: Options) -> str:
    knee, best = outcome.knee, outcome.best_within_target
    lines = [
        f"Command: `{opts.command}`",
        "",
        report.points_table(outcome.points),
        "",
        f"Stopped: {outcome.stop_reason}.",
        f"Knee (throughput gain < {opts.min_gain:.0%} beyond it): "
        + (f"c={knee.concurrency}, {knee.seq_per_s:.1f} seq/s, p99 {knee.p99_ms} ms" if knee else "none"),
        f"Best within p99 ≤ {opts.p99_target_ms:.0f} ms: "
        + (f"c={best.concurrency}, {best.seq_per_s:.1f} seq/s, p99 {best.p99_ms} ms" if best else "none"),
    ]
    return "\n".join(lines) + "\n"


def ramp(opts: Options) -> RampOutcome:
    ensure_work_dir()
    log_dir = WORK_DIR / "logs" / time.strftime("ramp-%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    corpus, _ = prepare_corpus(opts.seed, opts.corpus_limit)
    groups = batches(corpus.texts, opts.texts_per_request)
    chosen = None
    for info, server in servers(opts, log_dir):
        if info.name == opts.system:
            if server is None:
                raise SystemExit(f"{opts.system} cannot run: {info.reason}")
            chosen = server
            break
    if chosen is None:
        raise SystemExit(f"no system named {opts.system}")
    points: list[Point] = []
    why = "reached the step or concurrency bound"
    try:
        print(f"{opts.system}: up in {chosen.start():.1f} s", flush=True)
        target = loadgen.Target(
            chosen.base_url + chosen.embeddings_path, systems.MODEL_NAME, opts.encoding_format
        )
        requests = loadgen.encode_requests(target, groups)
        timing = loadgen.Timing(opts.warmup_s, opts.duration_s, opts.request_timeout_s)
        for conc in concurrency_steps(
            opts.start_concurrency, opts.factor, opts.max_concurrency, opts.max_steps
        ):
            point, _, _ = retry_disturbed(
                lambda conc=conc: loadgen.measure(
                    opts.system,
                    "ramp",
                    target,
                    requests,
                    conc,
                    timing,
                    opts.client_processes,
                    chosen.session_id,
                ),
                opts.max_other_load,
                opts.retries,
            )
            points.append(point)
            print(report.points_table([point]).splitlines()[-1], flush=True)
            reason = stop_reason(point, opts.p99_target_ms, opts.max_error_rate)
            if reason:
                why = reason
                break
    finally:
        chosen.stop()
    outcome = RampOutcome(
        points,
        why,
        find_knee(points, opts.min_gain),
        best_within(points, opts.p99_target_ms, opts.max_error_rate),
    )
    _write(outcome, opts, opts.out)
    return outcome


def _write(outcome: RampOutcome, opts: Options, out: Path) -> None:
    import json
    from dataclasses import asdict

    from bench.plot import plot_curve

    out.mkdir(parents=True, exist_ok=True)
    text = render(outcome, opts)
    (out / "ramp.md").write_text(text + "\n![ramp](ramp.png)\n")
    (out / "ramp.json").write_text(json.dumps({"command": opts.command, **asdict(outcome)}, indent=2))
    if outcome.points:
        plot_curve(
            outcome.points, out / "ramp.png", f"ramp: {opts.system}, {opts.texts_per_request} texts/request"
        )
    print("\n" + text, flush=True)

"""``python -m bench.tune``: sweep the Inference deployment's batching knobs against a p99 target.

Like Triton's Model Analyzer: the service starts once; each setting of the grid is applied as a new
``user_config`` (Ray Serve calls ``reconfigure()`` on the live replicas, no restart), the tuner waits
until the controller reports it in force on every replica, measures one closed-loop workload, and moves
on. It prints the curve it measured, picks the highest throughput whose p99 meets the target, and with
``--write`` puts that setting into the config file (comments kept; only that user_config changes).

    python -m bench.tune --p99-target-ms 500 --concurrency 16 \\
        --grid max_batch_size=8,16,32,64 --grid batch_wait_timeout_s=0.002,0.01 --write
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench import config_edit, loadgen, systems
from bench.cli import WORK_DIR
from bench.results import Point
from bench.service import RayServeService, ServiceVariant, load_config, parse_env_pair
from deployments.tools.corpus import batches

DEFAULT_GRID: dict[str, list[Any]] = {
    "max_batch_size": [8, 16, 32, 64],
    "batch_wait_timeout_s": [0.002, 0.01],
    "max_batch_tokens": [4096, 16384],
}


def batching_fields() -> set[str] | None:
    """The keys the service's Inference user_config accepts (None when the model cannot be imported)."""
    try:
        from deployments.user_config import BatchingConfig
    except ImportError:
        return None
    return set(BatchingConfig.model_fields)


def default_grid(fields: set[str] | None) -> dict[str, list[Any]]:
    """The default sweep, without knobs this version of the service does not have."""
    return {k: v for k, v in DEFAULT_GRID.items() if fields is None or k in fields}


def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...``; values are YAML scalars (``8``, ``0.005``, ``true``, ``null``)."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise argparse.ArgumentTypeError(f"expected KEY=V1,V2,..., got {text!r}")
    return key, [yaml.safe_load(v) for v in values.split(",")]


def settings(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def validate(base: dict[str, Any], candidates: Sequence[dict[str, Any]]) -> list[str]:
    """Problems with settings the service would refuse (checked with its own BatchingConfig)."""
    try:
        from pydantic import ValidationError

        from deployments.user_config import BatchingConfig
    except ImportError:
        return []
    problems = []
    for s in candidates:
        try:
            BatchingConfig.model_validate({**base, **s})
        except ValidationError as exc:
            problems.append(f"{s}: {exc.errors(include_url=False)[0]['msg']}")
    return problems


def pick_best(points: Sequence[Point], p99_target_ms: float, max_error_rate: float = 0.01) -> Point | None:
    """Highest seq/s with p99 within the target and errors within the limit (ties: lower p99)."""
    ok = [
        p
        for p in points
        if p.p99_ms is not None and p.p99_ms <= p99_target_ms and p.error_rate <= max_error_rate
    ]
    return max(ok, key=lambda p: (p.seq_per_s, -(p.p99_ms or 0.0)), default=None)


def curve_table(points: Sequence[Point], best: Point | None) -> str:
    lines = [
        "| setting | req/s | seq/s | p50 ms | p99 ms | errors | other load | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        setting = ", ".join(f"{k}={v}" for k, v in p.setting.items())
        mark = "**best**" if p is best else ""
        p50 = "-" if p.p50_ms is None else f"{p.p50_ms:.1f}"
        p99 = "-" if p.p99_ms is None else f"{p.p99_ms:.1f}"
        other = "-" if p.other_load is None else f"{p.other_load:.0%}"
        lines.append(
            f"| {setting} | {p.req_per_s:.1f} | {p.seq_per_s:.1f} | {p50} | {p99} | {p.errors} "
            f"| {other} | {mark} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=Path("serve_config.yaml"))
    p.add_argument(
        "--app",
        default=None,
        help="application name (default: the one holding --deployment: the default model's for Inference)",
    )
    p.add_argument("--deployment", default="Inference")
    p.add_argument(
        "--grid",
        action="append",
        type=parse_grid_arg,
        default=[],
        metavar="KEY=V1,V2,...",
        help="a swept user_config key (repeatable); default: "
        + "; ".join(f"{k}={','.join(map(str, v))}" for k, v in DEFAULT_GRID.items()),
    )
    p.add_argument("--p99-target-ms", type=float, default=500.0)
    p.add_argument("--max-error-rate", type=float, default=0.01)
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--quick", action="store_true", help="1 s warm-up, 3 s per setting")
    p.add_argument("--service-env", action="append", default=[], metavar="KEY=VAL")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--out", type=Path, default=WORK_DIR / "tune")
    p.add_argument("--write", action="store_true", help="write the best setting into the config file")
    p.add_argument("--write-to", type=Path, default=None, help="file to write (default: --config)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    grid = dict(ns.grid) or default_grid(batching_fields())
    base_config = load_config(ns.config)
    base_user = config_edit.user_config_of(base_config, ns.deployment, ns.app)
    candidates = settings(grid)
    problems = validate(base_user, candidates)
    if problems:
        print("error: the service would refuse these settings:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    warmup, duration = (1.0, 3.0) if ns.quick else (ns.warmup, ns.duration)
    from bench.__main__ import exit_on_sigterm

    exit_on_sigterm()
    from bench.runner import ensure_work_dir, prepare_corpus

    ensure_work_dir()
    log_dir = WORK_DIR / "logs" / time.strftime("tune-%Y%m%d-%H%M%S")
    corpus, _ = prepare_corpus(seed=0)
    variant = ServiceVariant("service", ns.config, dict(parse_env_pair(e) for e in ns.service_env))
    service = RayServeService(variant, log_dir, ns.num_cpus)
    points: list[Point] = []
    print(
        f"{len(candidates)} settings x ({warmup:g} s warm-up + {duration:g} s); logs: {log_dir}", flush=True
    )
    try:
        service.start()
        target = loadgen.Target(f"{service.base_url}/v1/embeddings", systems.MODEL_NAME)
        requests = loadgen.encode_requests(target, batches(corpus.texts, ns.texts_per_request))
        timing = loadgen.Timing(warmup, duration)
        for setting in candidates:
            cfg = config_edit.with_user_config(base_config, setting, ns.deployment, ns.app)
            try:
                applied_in = service.apply(cfg)
            except RuntimeError as exc:
                print(f"{setting}: not applied: {exc}", file=sys.stderr, flush=True)
                continue
            point, _ = loadgen.measure(
                "service", "tune", target, requests, ns.concurrency, timing, server_session=service.session_id
            )
            point = Point(**{**asdict(point), "setting": setting})
            points.append(point)
            print(
                f"{setting} (in force after {applied_in:.1f} s): {point.seq_per_s:.1f} seq/s, "
                f"p50 {point.p50_ms} ms, p99 {point.p99_ms} ms, errors {point.errors}",
                flush=True,
            )
    finally:
        service.stop()
    best = pick_best(points, ns.p99_target_ms, ns.max_error_rate)
    text = _summary(argv, ns, points, best)
    _save(ns.out, text, points, best, argv)
    print("\n" + text)
    if best is None:
        print(f"no setting met p99 <= {ns.p99_target_ms:g} ms; nothing written", file=sys.stderr)
        return 1
    if ns.write:
        path = ns.write_to or ns.config
        config_edit.write_user_config(path, best.setting, ns.deployment, ns.app)
        print(f"wrote {best.setting} into {path} ({ns.deployment} user_config)")
    return 0


def _summary(argv: list[str], ns: argparse.Namespace, points: list[Point], best: Point | None) -> str:
    workload = f"{ns.texts_per_request} text(s) per request at concurrency {ns.concurrency}"
    verdict = (
        f"Best within p99 <= {ns.p99_target_ms:g} ms: {best.setting} "
        f"({best.seq_per_s:.1f} seq/s, p99 {best.p99_ms} ms)"
        if best
        else f"No setting met p99 <= {ns.p99_target_ms:g} ms."
    )
    command = "python -m bench.tune " + " ".join(shlex.quote(a) for a in argv)
    return f"Command: `{command}`\n\nWorkload: {workload}.\n\n{curve_table(points, best)}\n\n{verdict}\n"


def _save(out: Path, text: str, points: list[Point], best: Point | None, argv: list[str]) -> None:
    from bench.plot import plot_curve

    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.md").write_text(text + ("\n![tune](tune.png)\n" if points else ""))
    data = {"argv": argv, "points": [asdict(p) for p in points], "best": asdict(best) if best else None}
    (out / "tune.json").write_text(json.dumps(data, indent=2))
    if points:
        plot_curve(points, out / "tune.png", "tuner: latency against throughput per setting")


if __name__ == "__main__":
    sys.exit(main())

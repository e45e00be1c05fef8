"""Command line of ``python -m bench``: ``run`` (all systems side by side) and ``ramp`` (find the knee)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.cli_types import (
    INFINITY_LABELS,
    concurrency_list,
    infinity_configs,
    inprocess_spec,
    positive,
    rate,
    workloads,
)
from bench.service import PROXY_ENV, ROOT, ServiceVariant, parse_env_pair, parse_service

WORK_DIR = ROOT / ".bench"
OPEN_LOOP_RATES, OPEN_LOOP_RATES_QUICK = [10, 20, 30, 40, 60], [10, 30]  # W3's offered req/s
# Arrivals W3 measures at each rate (at least; the window is never shorter than --duration): a p99 needs them.
# From 150-300 (15 s at 10-20 req/s) a p99 is the 2nd-4th slowest answer, and the same system's p99 swung
# 0.7-1.4x between rounds (docs/architecture.md, "A p99 needs arrivals"); from 1000 it is the 10th.
OPEN_LOOP_REQUESTS = 1000
# W4 (bench/mixed.py): requests of 1-4, 32 or 256 texts, 15.1 on average, so 2 req/s offer about 30 texts/s:
# about half of what Infinity's ONNX engine answers on 32-text requests on 2 cores (55-85 texts/s in the runs
# of docs/benchmarks.md; at 3 req/s, 54 texts/s drawn, it fell behind in a first try, with other load on the
# machine), a sixth or less of the service's (180-410). From 500 arrivals (250 s at 2 req/s) the 1-4-text
# requests' p99 is about their 4th slowest answer.
MIXED_RATE, MIXED_REQUESTS, MIXED_P99_MS = 2.0, 500, 10_000.0
DEFAULT_MODEL_DIR = Path("models/all-MiniLM-L6-v2/1")
SYSTEM_CHOICES = ("naive-fastapi", *INFINITY_LABELS)
# The same config on Ray Serve's Python proxy instead of its high-throughput mode (HAProxy, direct ingress,
# gRPC between replicas), which serve_config.yaml switches on; `run` measures both in one table.
PROXY_SPEC = "service-proxy=serve_config.yaml," + ",".join(f"{k}={v}" for k, v in PROXY_ENV.items())


@dataclass
class Options:
    mode: str  # "run" or "ramp"
    command: str  # the command line, for the report
    out: Path
    warmup_s: float
    duration_s: float
    inprocess_warmup_s: float
    inprocess_duration_s: float
    request_timeout_s: float
    services: list[ServiceVariant]
    naive: bool
    with_infinity: bool
    infinity_venv: Path
    inprocess: list[tuple[str, Path]]  # explicit rows; empty: the defaults (torch, and onnx unless off)
    inprocess_enabled: bool
    onnx: bool
    model_dir: Path
    w1_concurrency: list[int]
    w2_concurrency: list[int]
    w2_texts: int
    seed: int
    corpus_limit: int | None
    client_processes: int
    encoding_format: str
    num_cpus: int | None
    quick: bool
    max_other_load: float
    retries: int
    quiet_wait_s: float
    doc: Path | None = None
    rounds: int = 1  # run only: each HTTP system started and measured this many times
    open_loop_rates: list[int] = field(default_factory=list)  # run only: W3's offered rates (req/s)
    open_loop_p99_ms: float = 500.0  # run only: a rate is sustained only with p99 within this
    open_loop_requests: int = 0  # run only: arrivals measured per rate, at least (the window grows to fit)
    infinity_configs: list[str] = field(default_factory=list)  # which of infinity.CONFIGS run (empty: all)
    mixed_rate: float = 0.0  # run only: W4's offered req/s (0: no W4)
    mixed_requests: int = 0  # run only: W4's arrivals measured, at least (the window grows to fit)
    mixed_p99_ms: float = (
        MIXED_P99_MS  # run only: W4 is sustained only with the p99 of all requests within this
    )
    # ramp only
    system: str = ""
    texts_per_request: int = 1
    p99_target_ms: float = 500.0
    max_error_rate: float = 0.01
    start_concurrency: int = 1
    factor: float = 2.0
    max_concurrency: int = 256
    max_steps: int = 12
    min_gain: float = 0.1


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("systems")
    g.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="NAME=CONFIG[,KEY=VAL...]",
        help=(
            "a variant of this service (repeatable); default: service=serve_config.yaml, and for `run`"
            f" also {PROXY_SPEC}"
        ),
    )
    g.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="environment for the Ray processes of every service variant (repeatable)",
    )
    g.add_argument("--no-service", action="store_true", help="do not measure this service")
    g.add_argument("--no-naive", action="store_true", help="skip the naive FastAPI endpoint")
    g.add_argument(
        "--with-infinity",
        action="store_true",
        help="measure Infinity (torch fp32/bf16 and ONNX engines); creates .bench/infinity-venv once",
    )
    g.add_argument(
        "--infinity-configs",
        type=infinity_configs,
        default=None,
        metavar="LABEL[,LABEL...]",
        help=f"with --with-infinity, only these of {', '.join(INFINITY_LABELS)} (default: all)",
    )
    g.add_argument("--infinity-venv", type=Path, default=WORK_DIR / "infinity-venv")
    g.add_argument("--num-cpus", type=int, default=None, help="CPUs the private Ray instance advertises")
    t = p.add_argument_group("timing and load")
    t.add_argument("--warmup", type=float, default=5.0, help="seconds of warm-up per point (default 5)")
    t.add_argument("--duration", type=float, default=15.0, help="seconds measured per point (default 15)")
    t.add_argument("--request-timeout", type=float, default=60.0)
    t.add_argument(
        "--quick", action="store_true", help="smoke test: 1 s warm-up, 3 s per point, fewer points"
    )
    t.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="load generator processes (one aiohttp loop each); default 1",
    )
    t.add_argument("--encoding-format", choices=("float", "base64"), default="float")
    t.add_argument(
        "--max-other-load",
        type=float,
        default=0.10,
        help="re-measure a point when other processes used more than this share of the CPUs",
    )
    t.add_argument("--retries", type=int, default=2, help="re-measurements of a disturbed point (default 2)")
    t.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before each point, wait up to this long for other load to fall below --max-other-load",
    )
    t.add_argument("--seed", type=int, default=0, help="corpus shuffle seed")
    t.add_argument("--corpus-limit", type=int, default=None, help="use only the first N corpus texts")
    p.add_argument(
        "--model-dir",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        help="model version dir (manifest.json) for the in-process rows and the ONNX export",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Benchmark the embedding service.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="all systems side by side: in-process limit, service, naive, Infinity")
    _common(run)
    run.add_argument(
        "--out",
        type=Path,
        default=WORK_DIR / "results",
        help="directory for results.json, table.md, plot.png (default .bench/results)",
    )
    run.add_argument(
        "--inprocess",
        action="append",
        type=inprocess_spec,
        default=[],
        metavar="LABEL=MODEL_DIR",
        help="an in-process row (repeatable); default: torch=<model-dir> and onnx=<its export>",
    )
    run.add_argument("--no-inprocess", action="store_true", help="skip the in-process rows")
    run.add_argument("--no-onnx", action="store_true", help="no in-process ONNX row (and no export)")
    run.add_argument("--w1-concurrency", type=concurrency_list, default=None, help="default 1,8,32")
    run.add_argument("--w2-concurrency", type=concurrency_list, default=None, help="default 4")
    run.add_argument("--w2-texts", type=int, default=32, help="texts per request in W2 (default 32)")
    run.add_argument(
        "--open-loop-rates",
        type=concurrency_list,
        default=None,
        help="req/s offered in W3, Poisson arrivals of single texts (default 10,20,30,40,60; --quick: 10,30)",
    )
    run.add_argument("--no-open-loop", action="store_true", help="skip the open-loop workload W3")
    run.add_argument("--open-loop-p99-ms", type=float, default=500.0, help="W3: sustained needs p99 <= this")
    run.add_argument(
        "--open-loop-requests",
        type=int,
        default=None,
        help=f"W3: measure at least this many arrivals per rate, the window longer than --duration where "
        f"needed (default {OPEN_LOOP_REQUESTS}; --quick: 0, the window alone)",
    )
    run.add_argument(
        "--workloads",
        type=workloads,
        default=None,
        metavar="W[,W...]",
        help="measure only these workloads: W1, W2, W3, W4 (aliases single, batch, open, mixed); default all",
    )
    run.add_argument(
        "--mixed-rate",
        type=rate,
        default=MIXED_RATE,
        help=f"W4: req/s offered, Poisson arrivals of 1-4, 32 or 256 texts (default {MIXED_RATE:g}, "
        "about 30 texts/s)",
    )
    run.add_argument(
        "--mixed-requests",
        type=int,
        default=None,
        help=f"W4: measure at least this many arrivals, the window longer than --duration where needed "
        f"(default {MIXED_REQUESTS}; --quick: 0; the window is at most 900 s)",
    )
    run.add_argument(
        "--mixed-p99-ms",
        type=float,
        default=MIXED_P99_MS,
        help=f"W4: sustained needs the p99 of all its requests <= this (default {MIXED_P99_MS:g})",
    )
    run.add_argument("--no-mixed", action="store_true", help="skip the mixed-size open-loop workload W4")
    run.add_argument(
        "--rounds",
        type=positive,
        default=1,
        help="start and measure every HTTP system this many times, round after round; the ratios are "
        "the median over the rounds (default 1)",
    )
    run.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="also put the report between the bench markers of this markdown file",
    )

    ramp = sub.add_parser("ramp", help="raise concurrency until p99 or errors pass a limit; report the knee")
    _common(ramp)
    ramp.add_argument(
        "--system",
        default="service",
        help=f"a --service name (default 'service') or one of {', '.join(SYSTEM_CHOICES)}",
    )
    ramp.add_argument("--out", type=Path, default=WORK_DIR / "ramp")
    ramp.add_argument("--texts-per-request", type=int, default=1)
    ramp.add_argument("--p99-target-ms", type=float, default=500.0)
    ramp.add_argument("--max-error-rate", type=float, default=0.01)
    ramp.add_argument("--start", type=int, default=1, help="first concurrency (default 1)")
    ramp.add_argument("--factor", type=float, default=2.0, help="concurrency multiplier per step (default 2)")
    ramp.add_argument("--max-concurrency", type=int, default=256)
    ramp.add_argument("--max-steps", type=int, default=12)
    ramp.add_argument(
        "--min-gain",
        type=float,
        default=0.1,
        help="knee: the step after which throughput grows by less than this fraction",
    )
    sub.add_parser("corpus", help="print the corpus statistics and a few texts")
    return parser


def parse(argv: Sequence[str] | None = None) -> Options:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    if ns.command == "corpus":
        raise SystemExit(_print_corpus())
    common_env = dict(parse_env_pair(e) for e in ns.service_env)
    specs = ns.service or (["service=serve_config.yaml"] + ([PROXY_SPEC] if ns.command == "run" else []))
    services = [] if ns.no_service else [parse_service(s, common_env) for s in specs]
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: service names must be unique: {names}")
    warmup, duration = (1.0, 3.0) if ns.quick else (ns.warmup, ns.duration)
    is_run = ns.command == "run"
    opts = Options(
        mode=ns.command,
        command="python -m bench " + " ".join(shlex.quote(a) for a in argv),
        out=ns.out,
        warmup_s=warmup,
        duration_s=duration,
        inprocess_warmup_s=0.5 if ns.quick else min(warmup, 3.0),
        inprocess_duration_s=2.0 if ns.quick else duration,
        request_timeout_s=ns.request_timeout,
        services=services,
        naive=not ns.no_naive,
        with_infinity=ns.with_infinity,
        infinity_venv=ns.infinity_venv,
        infinity_configs=ns.infinity_configs or [],
        inprocess=(ns.inprocess if is_run else []),
        inprocess_enabled=is_run and not ns.no_inprocess,
        onnx=is_run and not ns.no_onnx and not ns.no_inprocess,
        model_dir=ns.model_dir,
        w1_concurrency=(ns.w1_concurrency or ([1, 8] if ns.quick else [1, 8, 32])) if is_run else [],
        w2_concurrency=(ns.w2_concurrency or [4]) if is_run else [],
        w2_texts=ns.w2_texts if is_run else 32,
        seed=ns.seed,
        corpus_limit=ns.corpus_limit,
        client_processes=ns.client_processes,
        encoding_format=ns.encoding_format,
        num_cpus=ns.num_cpus,
        quick=ns.quick,
        max_other_load=ns.max_other_load,
        retries=0 if ns.quick else ns.retries,
        quiet_wait_s=0.0 if ns.quick else ns.quiet_wait,
        doc=ns.doc if is_run else None,
        rounds=ns.rounds if is_run else 1,
    )
    if is_run and not ns.no_open_loop:
        rates = ns.open_loop_rates or (OPEN_LOOP_RATES_QUICK if ns.quick else OPEN_LOOP_RATES)
        opts.open_loop_rates = sorted(set(rates))
        opts.open_loop_p99_ms = ns.open_loop_p99_ms
        default_requests = 0 if ns.quick else OPEN_LOOP_REQUESTS
        opts.open_loop_requests = default_requests if ns.open_loop_requests is None else ns.open_loop_requests
    if is_run and not ns.no_mixed:
        opts.mixed_rate = ns.mixed_rate
        opts.mixed_p99_ms = ns.mixed_p99_ms
        default_requests = 0 if ns.quick else MIXED_REQUESTS
        opts.mixed_requests = default_requests if ns.mixed_requests is None else ns.mixed_requests
    if is_run and ns.workloads is not None:
        only_some(opts, ns.workloads)
    if not is_run:
        opts.system = ns.system
        opts.texts_per_request = ns.texts_per_request
        opts.p99_target_ms = ns.p99_target_ms
        opts.max_error_rate = ns.max_error_rate
        opts.start_concurrency = ns.start
        opts.factor = ns.factor
        opts.max_concurrency = ns.max_concurrency
        opts.max_steps = ns.max_steps
        opts.min_gain = ns.min_gain
        known = {*names, *SYSTEM_CHOICES}
        if opts.system not in known:
            raise SystemExit(f"error: --system {opts.system!r} is none of {sorted(known)}")
        opts.with_infinity = opts.with_infinity or opts.system.startswith("infinity-")
    return opts


def only_some(opts: Options, workloads: Sequence[str]) -> None:
    """Leave out of ``opts`` every workload not in ``workloads`` (``--workloads``)."""
    if "W1" not in workloads:
        opts.w1_concurrency = []
    if "W2" not in workloads:
        opts.w2_concurrency = []
    if "W3" not in workloads:
        opts.open_loop_rates = []
    if "W4" not in workloads:
        opts.mixed_rate = 0.0


def _print_corpus() -> int:
    from deployments.tools.corpus import build_corpus

    corpus = build_corpus()
    print(corpus.stats())
    for text in corpus.texts[:5]:
        print("-", text)
    return 0

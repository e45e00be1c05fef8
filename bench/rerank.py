"""Rerank throughput in (query, document) pairs per second: this service against Infinity's ``/rerank``, both
serving the same locally built cross-encoder, measured one after the other in one run.

    .venv/bin/python -m bench.rerank --with-infinity            # about 4 minutes on 2 cores
    .venv/bin/python -m bench.rerank --documents 100 --concurrency 1,4

Each request reranks ``--documents`` texts of the benchmark corpus against a query from it (closed loop, one
body per request, the same bodies for every system). Rows: the service's ``/v1/rerank`` on the demo
cross-encoder (``demo-cross-encoder``, random weights, as shipped: torch bf16 traced, and in fp32), the same
route on all-MiniLM-L6-v2 (a bi-encoder: cosine of embeddings, the shipped config unchanged), and Infinity
0.0.78's ``/rerank`` on the cross-encoder (torch engine, fp32 and bf16). The ratios compare the service's best
cross-encoder row with Infinity's best at the same concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench import infinity, procs
from bench.cli import ROOT, WORK_DIR
from bench.loadgen import Requests, Target, Timing, measure
from bench.results import Point
from bench.service import RayServeService, ServiceVariant
from deployments.tools.corpus import build_corpus
from deployments.tools.demo_models import DEMOS, VERSION, build

CROSS = next(s for s in DEMOS if s.task == "rerank")
RESULT_KEY = b'"relevance_score":'


def rerank_bodies(model: str, documents: int, count: int = 64) -> Requests:
    texts = list(build_corpus(seed=1).texts)
    bodies = []
    for i in range(count):
        group = random.Random(i).sample(texts, documents + 1)
        payload = {"model": model, "query": group[0], "documents": group[1:], "return_documents": False}
        bodies.append(json.dumps(payload).encode())
    return Requests(tuple(bodies), (documents,) * count, documents, RESULT_KEY)


def cross_encoder_config(repository: Path, precision: str) -> dict[str, Any]:
    """The shipped config with its model application serving the demo cross-encoder instead."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    router, model = config["applications"][0], config["applications"][1]
    model["name"] = CROSS.name
    model["args"]["model"] = {
        "repository": str(repository),
        "name": CROSS.name,
        "version": VERSION,
        "task": "rerank",
        "precision": precision,
    }
    router["args"] = {**router["args"], "models": [CROSS.name], "default_model": CROSS.name}
    return config


def measure_service(name: str, config: dict[str, Any], model: str, opts: argparse.Namespace) -> list[Point]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f)
    variant = ServiceVariant(name=name, config=Path(f.name))
    points = []
    with RayServeService(variant, opts.out) as service:
        target = Target(f"{service.base_url}/v1/rerank", model)
        for c in opts.concurrency:
            point, errors = measure(
                name, "rerank", target, rerank_bodies(model, opts.documents), c, opts.timing
            )
            points.append(_report(point, errors))
    return points


def measure_infinity(name: str, model_dir: Path, dtype: str | None, opts: argparse.Namespace) -> list[Point]:
    env = infinity.ensure_venv(opts.infinity_venv, opts.out / "infinity-install.log")
    port = procs.free_port()
    cmd, cwd = infinity.command(env, "torch", model_dir, port, CROSS.name, dtype)
    cmd = [c for c in cmd if c not in ("--pooling-method", "mean")]  # a cross-encoder has no pooling
    log = opts.out / f"{name}.log"
    proc = procs.start(cmd, log, env=infinity.server_env(dict(os.environ)), cwd=cwd)
    points = []
    try:
        procs.wait_http_ok(f"http://127.0.0.1:{port}/health", 300.0, proc, log)
        target = Target(f"http://127.0.0.1:{port}/rerank", CROSS.name)
        for c in opts.concurrency:
            point, errors = measure(
                name, "rerank", target, rerank_bodies(CROSS.name, opts.documents), c, opts.timing
            )
            points.append(_report(point, errors))
    finally:
        procs.stop(proc)
    return points


def _report(point: Point, errors: list[str]) -> Point:
    print(
        f"| {point.system} | {point.concurrency} | {point.seq_per_s:.1f} | {point.req_per_s:.2f} | "
        f"{point.p50_ms or 0:.0f} | {point.p99_ms or 0:.0f} | {point.errors} |",
        flush=True,
    )
    for e in errors[:2]:
        print(f"    error: {e}", flush=True)
    return point


def ratios(points: list[Point]) -> list[str]:
    lines = []
    for c in sorted({p.concurrency for p in points}):
        ours = [p for p in points if p.concurrency == c and p.system.startswith("service-cross")]
        theirs = [p for p in points if p.concurrency == c and p.system.startswith("infinity")]
        if ours and theirs:
            best_ours = max(ours, key=lambda p: p.seq_per_s)
            best_theirs = max(theirs, key=lambda p: p.seq_per_s)
            lines.append(
                f"concurrency {c}: {best_ours.system} {best_ours.seq_per_s:.1f} pairs/s vs "
                f"{best_theirs.system} {best_theirs.seq_per_s:.1f}: "
                f"{best_ours.seq_per_s / best_theirs.seq_per_s:.2f} x"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rerank pairs/s: this service and Infinity, one run.")
    parser.add_argument("--with-infinity", action="store_true")
    parser.add_argument("--infinity-venv", type=Path, default=WORK_DIR / "infinity-venv")
    parser.add_argument("--documents", type=int, default=32, help="documents per request (default 32)")
    parser.add_argument("--concurrency", default="1,4", help="closed-loop clients (default 1,4)")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=WORK_DIR / "rerank")
    opts = parser.parse_args(argv)
    opts.concurrency = [int(c) for c in opts.concurrency.split(",")]
    opts.timing = Timing(opts.warmup, opts.duration)
    opts.out.mkdir(parents=True, exist_ok=True)
    repository = WORK_DIR / "rerank-models"
    print(build(CROSS, repository, onnx=False), flush=True)
    print("| system | clients | pairs/s | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|")
    points: list[Point] = []
    for precision in ("bf16", "fp32"):
        config = cross_encoder_config(repository, precision)
        points += measure_service(f"service-cross-{precision}", config, CROSS.name, opts)
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    points += measure_service("service-minilm-biencoder", shipped, "all-MiniLM-L6-v2", opts)
    if opts.with_infinity:
        model_dir = repository / CROSS.name / VERSION
        points += measure_infinity("infinity-torch-fp32", model_dir, None, opts)
        points += measure_infinity("infinity-torch-bf16", model_dir, "bfloat16", opts)
    for line in ratios(points):
        print(line, flush=True)
    (opts.out / "results.json").write_text(json.dumps([p.__dict__ for p in points], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

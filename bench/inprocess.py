"""The in-process limit: tokenize + forward + pool with no serving at all, per model backend.

Run in a child process by the benchmark (so the models and their thread pools are gone before the
servers are measured):

    python -m bench.inprocess --request req.json --out out.json

The request names model directories (each holding a ``manifest.json``; the manifest's format picks
torch or ONNX Runtime) and the texts. The model runs with the libraries directly, not through the service's
code: ``tokenizers`` for the tokenizer file, ``transformers`` + torch with the manifest's pooling for
``format: transformers``, ``onnxruntime`` on ``model.onnx`` (pooling inside the export) for ``format: onnx``.
Three rows per model:

- ``b1``: one text per call;
- ``b32-sorted``: the whole corpus sorted by token count, cut into groups of 32 (the groups in shuffled
  order), one forward pass per group: almost no padding, the limit;
- ``b32-requests``: W2's own requests (the same consecutive groups of 32 texts the load generator
  sends), one call each, cut into length-sorted forward passes within the service's micro-batch limits:
  what the model alone does with exactly the texts the service gets, one request at a time.

It also computes reference embeddings for the correctness check of every HTTP system, with plain
transformers.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.embedder import Embedder, load_model_dir
from bench.machine import OtherLoadProbe, wait_for_quiet
from bench.results import REQUESTS_SUFFIX, Point, retry_disturbed, summarize
from deployments.tools.corpus import batches

MAX_CALLS = 1_000_000


@dataclass(frozen=True)
class Row:
    """One in-process row: how the texts are grouped into calls and cut into forward passes."""

    workload: str
    groups: list[list[str]]
    pass_sequences: int  # sequences per forward pass
    pass_tokens: int  # padded tokens per forward pass


def rows_for(
    texts: list[str],
    lengths: list[int],
    max_tokens: int,
    seed: int,
    request_texts: int,
    micro_batch: tuple[int, int],
) -> list[Row]:
    """The rows measured per model (module docstring); ``micro_batch`` is the service's pass limits."""
    sorted32 = [[texts[i] for i in g] for g in sorted_groups(lengths, 32, seed)]
    return [
        Row("b1", [[texts[i] for i in g] for g in sorted_groups(lengths, 1, seed)], 1, max_tokens),
        Row("b32-sorted", sorted32, 32, 32 * max_tokens),
        Row(f"b{request_texts}{REQUESTS_SUFFIX}", batches(texts, request_texts), *micro_batch),
    ]


def sorted_groups(lengths: list[int], size: int, seed: int) -> list[list[int]]:
    """Indices sorted by length, cut into groups of ``size`` (full groups only), in shuffled order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups = [order[i : i + size] for i in range(0, len(order) - size + 1, size)]
    random.Random(seed).shuffle(groups)
    return groups


def default_micro_batch() -> tuple[int, int]:
    """The code's default pass limits (``BatchingConfig``: micro_batch_size, micro_batch_tokens)."""
    from deployments.user_config import BatchingConfig

    defaults = BatchingConfig()
    return defaults.micro_batch_size, defaults.micro_batch_tokens


@dataclass(frozen=True)
class RowPlan:
    """How each in-process row is measured: timing, retries, and the shape of W2's requests."""

    warmup_s: float
    duration_s: float
    seed: int = 0
    max_other_load: float = 1.0
    retries: int = 0
    quiet_wait_s: float = 0.0
    request_texts: int = 32
    # The service's sequences and padded tokens per pass (bench.inprocess_plan.service_micro_batch).
    micro_batch: tuple[int, int] = field(default_factory=default_micro_batch)


def measure_model(
    label: str,
    model_dir: Path,
    texts: list[str],
    plan: RowPlan,
    device: str = "cpu",
    precision: str = "fp32",
    graph: str = "eager",
    threads: int | None = None,
    parallel: int = 1,
) -> list[Point]:
    embedder = Embedder(load_model_dir(model_dir), device, precision, graph, threads, parallel)
    return measure_embedder(label, embedder, texts, plan)


def measure_embedder(label: str, embedder: Any, texts: list[str], plan: RowPlan) -> list[Point]:
    """The rows of ``rows_for`` through a loaded model: ``embedder`` has ``max_tokens``, ``lengths(texts)``
    (token counts) and ``embed(texts, max_sequences, max_tokens)`` (an ``Embedder``, or anything alike)."""
    lengths = embedder.lengths(texts)
    points = []
    for spec in rows_for(
        texts, lengths, embedder.max_tokens, plan.seed, plan.request_texts, plan.micro_batch
    ):

        def call(group: list[str], spec: Row = spec) -> None:
            embedder.embed(group, spec.pass_sequences, spec.pass_tokens)

        row = functools.partial(
            _measure_row,
            f"inprocess-{label}",
            spec.workload,
            len(spec.groups[0]),
            call,
            spec.groups,
            plan.warmup_s,
            plan.duration_s,
            plan.max_other_load,
            plan.quiet_wait_s,
        )
        point, _, taken = retry_disturbed(row, plan.max_other_load, plan.retries)
        if taken > 1:
            print(f"{label} {spec.workload}: {taken} tries (the first ones were disturbed)", flush=True)
        points.append(point)
    return points


def _measure_row(
    system: str,
    workload: str,
    batch: int,
    call: Any,
    groups: list[list[str]],
    warmup_s: float,
    duration_s: float,
    quiet_threshold: float,
    quiet_wait_s: float,
) -> tuple[Point, list[str]]:
    if quiet_wait_s > 0:
        wait_for_quiet(None, quiet_threshold, quiet_wait_s)
    latencies, other = _timed_loop(call, groups, warmup_s, duration_s)
    return summarize(system, workload, 1, batch, sum(latencies), latencies, 0, other_load=other), []


def _timed_loop(
    call: Any, groups: list[list[str]], warmup_s: float, duration_s: float
) -> tuple[list[float], float | None]:
    """Call cyclically over ``groups``: ``warmup_s`` unmeasured, then ``duration_s`` of timed calls.
    Returns the latencies and the share of the CPUs other processes used meanwhile."""
    latencies: list[float] = []
    probe = OtherLoadProbe(server_session=None)  # everything but this process is "other"
    start = time.perf_counter()
    measuring = False
    for n in range(MAX_CALLS):
        t0 = time.perf_counter()
        if t0 - start >= warmup_s + duration_s:
            break
        if not measuring and t0 - start >= warmup_s:
            probe.start()
            measuring = True
        call(groups[n % len(groups)])
        if measuring:
            latencies.append(time.perf_counter() - t0)
    return latencies, probe.stop()


def reference_embeddings(model_dir: Path | None, texts: list[str]) -> list[list[float]]:
    from bench.naive_server import default_model_dir, embed_texts, load

    tokenizer, model = load(model_dir or default_model_dir())
    return [[float(x) for x in row] for row in embed_texts(tokenizer, model, texts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="In-process limit of the model backends.")
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    ns = parser.parse_args(argv)
    req = json.loads(ns.request.read_text())
    result: dict[str, Any] = {"points": [], "skipped": {}, "reference": []}
    plan = RowPlan(
        req["warmup_s"],
        req["duration_s"],
        req.get("seed", 0),
        req.get("max_other_load", 1.0),
        req.get("retries", 0),
        req.get("quiet_wait_s", 0.0),
        req.get("request_texts", 32),
        tuple(req.get("micro_batch") or default_micro_batch()),
    )
    for spec in req["specs"]:
        label, model_dir = spec["label"], Path(spec["model_dir"])
        try:
            points = measure_model(
                label,
                model_dir,
                req["texts"],
                plan,
                precision=spec.get("precision", "fp32"),
                graph=spec.get("graph", "eager"),
                threads=spec.get("threads"),
                parallel=spec.get("parallel", 1),
            )
            result["points"] += [asdict(p) for p in points]
            for p in points:
                print(f"{p.system} {p.workload}: {p.seq_per_s} seq/s, p50 {p.p50_ms} ms", flush=True)
        except Exception as exc:  # one backend failing must not hide the others
            result["skipped"][label] = f"{type(exc).__name__}: {exc}"
            print(f"{label}: skipped: {exc}", file=sys.stderr, flush=True)
    if req.get("check_texts"):
        result["reference"] = reference_embeddings(None, req["check_texts"])
    ns.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

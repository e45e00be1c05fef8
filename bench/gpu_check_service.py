"""bench/gpu_check.py's checks that need more than one model in process: an out-of-memory batch split and
retried, and the service under bulk load on the GPU (Ray Serve, over HTTP only)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.gpu_check import ROOT, _embed_model, _min_cosine, _texts

OOM_REQUESTS = 8
OOM_TEXTS_PER_REQUEST = 64
# Interactive p99 while a batch tenant saturates the GPU: at most 3x its p99 alone, plus 50 ms.
P99_FACTOR, P99_SLACK_MS = 3.0, 50.0


def check_oom_split() -> tuple[bool, dict[str, Any]]:
    """A batch of long texts with the process's GPU memory capped so the whole batch cannot fit: the
    runner halves the batch (AdaptiveBatchCap) and retries; every request in the groups is answered."""
    import numpy as np
    import torch

    from contracts.errors import ServiceError
    from deployments.pipeline.group_runner import OutputMaker, run_groups
    from deployments.runtime.backends import ready_runner
    from deployments.runtime.batching import BatchLimits
    from preprocess.tokenize import TextTokenizer

    model = _embed_model("fp32")
    runner = ready_runner(model, "cuda", 8, graph="eager")
    tok = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    corpus = _texts(512)
    long = [" ".join(corpus[i : i + 24]) for i in range(OOM_REQUESTS * OOM_TEXTS_PER_REQUEST)]
    requests = [
        tok.encode(long[i : i + OOM_TEXTS_PER_REQUEST], truncate=True)
        for i in range(0, len(long), OOM_TEXTS_PER_REQUEST)
    ]
    total_seqs = len(long)
    max_tokens = model.manifest.input.max_tokens
    reference = runner.run(
        [s for r in requests for s in r.sequences()], BatchLimits(32, 32 * max_tokens)
    ).values
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    runner.run(list(requests[0].sequences()), BatchLimits(64, 64 * max_tokens))
    per_64 = torch.cuda.max_memory_allocated() - base
    total = torch.cuda.get_device_properties(0).total_memory
    # Room for about two batches of 64: the whole batch of 512 cannot fit, its halves' halves can.
    fraction = min(1.0, (torch.cuda.memory_reserved() + 2 * per_64) / total)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        groups: list[list[Any]] = [requests[: OOM_REQUESTS // 2], requests[OOM_REQUESTS // 2 :]]
        run = run_groups(
            runner, groups, BatchLimits(total_seqs, total_seqs * max_tokens), OutputMaker.of(model)
        )
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    answers = [a for group in run.answers for a in group]
    failed = sum(isinstance(a, ServiceError) for a in answers)
    figures: dict[str, Any] = {
        "memory_cap_gib": round(fraction * total / 2**30, 2),
        "batch": total_seqs,
        "cap_before": total_seqs,  # run_groups' limits: the whole batch in one pass
        "cap_after": runner.cap.current,
        "answered": f"{len(answers) - failed}/{len(answers)}",
        "isolated_failures": run.isolated_failures,
    }
    split = runner.cap.current < total_seqs  # halved at least once: the out-of-memory happened
    ok = split and failed == 0 and run.isolated_failures == 0 and len(answers) == OOM_REQUESTS
    if ok:  # the split batches' vectors are the unsplit run's
        got = np.concatenate([a.values for a in answers])
        figures["min_cosine_vs_unsplit"] = round(_min_cosine(got, reference), 5)
        ok = figures["min_cosine_vs_unsplit"] >= 0.999
    return ok, figures


def _gpu_config(out: Path) -> Path:
    """serve_config.yaml with the model's Inference on the GPU, as k8s/overlay.yaml asks on the cluster."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    for app in config["applications"]:
        if app.get("import_path") != "deployments.app:build_model":
            continue
        for deployment in app.get("deployments", []):
            if deployment["name"] == "Inference":
                deployment.setdefault("ray_actor_options", {})["num_gpus"] = 1
    path = out / "serve_config.gpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def check_priority() -> tuple[bool, dict[str, Any]]:
    """bench/priority.py's setup (a tenants file with an interactive and a batch tenant, made with
    deployments.tools.keys): interactive requests alone, then beside bulk clients sending large batches."""
    from bench.priority import PHASES, RELOAD_S, _run_phase
    from bench.service import RayServeService, ServiceVariant
    from deployments.tools import keys

    out = Path(tempfile.mkdtemp(prefix="gpu-check-priority-"))
    tenants = out / "tenants.yaml"
    keys.set_policy(tenants, "search", {"priority": "interactive"})
    keys.set_policy(tenants, "bulk", {"priority": "batch"})
    made = {name: keys.add_key(tenants, name, None) for name in ("search", "bulk")}
    args = {"auth.keys_file": str(tenants), "auth.reload_interval_s": RELOAD_S, "model.device": "cuda"}
    args["runtime.parallel_passes"] = 1
    variant = ServiceVariant("gpu-service", _gpu_config(out), args=args)
    ns = argparse.Namespace(rate=20.0, bulk_clients=4, bulk_texts=256, warmup=3.0, duration=20.0, seed=7)
    texts = _texts()
    phases = {p.name: p for p in PHASES}
    with RayServeService(variant, out) as service:
        alone = asyncio.run(_run_phase(phases["interactive alone"], service.base_url, made, texts, ns))
        time.sleep(3.0)
        both = asyncio.run(_run_phase(phases["both, with priorities"], service.base_url, made, texts, ns))
    figures: dict[str, Any] = {
        "alone_p50_ms": _ms(alone.p50_ms),
        "alone_p99_ms": _ms(alone.p99_ms),
        "bulk_p50_ms": _ms(both.p50_ms),
        "bulk_p99_ms": _ms(both.p99_ms),
        "bulk_texts_per_s": _ms(both.bulk_texts_per_s),
        "interactive_ok": f"{both.interactive_ok}/{both.interactive_sent}",
        "bulk_errors": both.bulk_errors,
        "logs": str(out),
    }
    if alone.p99_ms is None or both.p99_ms is None:
        return False, figures
    bound = P99_FACTOR * alone.p99_ms + P99_SLACK_MS
    figures["bound_ms"] = f"p99 under bulk <= {P99_FACTOR} x alone + {P99_SLACK_MS:.0f} = {bound:.1f}"
    ok = both.p99_ms <= bound and both.interactive_ok == both.interactive_sent and both.bulk_requests > 0
    return ok, figures


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)

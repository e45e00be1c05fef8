"""Which in-process systems a benchmark run measures, and measuring them in a child process.

``inprocess-torch`` and ``inprocess-onnx`` (the model exported into ``.bench/``) by default, plus the torch
model exactly as the measured service config runs it (precision, graph, threads, passes) when that differs
from plain torch: the limit of the served backend beside ONNX Runtime's. "The service config" is its model
application (``deployments.app:build_model``: the router's default model's, else the first), and what it
does not write is the code's defaults (deployments/config.py). The rows themselves are ``bench.inprocess``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench import report
from bench.cli import WORK_DIR, Options
from bench.results import Point, RunReport, SystemInfo
from bench.service import ROOT, load_config
from deployments.tools.corpus import Corpus


def ensure_onnx_export(model_dir: Path, log: Path) -> Path:
    """``python -m deployments.runtime.export_onnx`` into .bench (re-done when the exporter changes)."""
    out = WORK_DIR / "onnx-export" / "-".join(model_dir.resolve().parts[-2:])
    exporter = ROOT / "deployments" / "runtime" / "export_onnx.py"
    manifest = out / "manifest.json"
    if manifest.is_file() and exporter.is_file() and manifest.stat().st_mtime > exporter.stat().st_mtime:
        return out
    cmd = [
        sys.executable,
        "-m",
        "deployments.runtime.export_onnx",
        "--model",
        str(model_dir),
        "--out",
        str(out),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0 or not manifest.is_file():
        raise RuntimeError(f"ONNX export failed (exit {done.returncode}); log: {log}")
    return out


@dataclass(frozen=True)
class InprocessSpec:
    """One in-process system: a model directory and how its runner runs (the torch settings)."""

    label: str
    model_dir: Path
    precision: str = "fp32"
    graph: str = "eager"
    threads: int | None = None
    parallel: int = 1


def inprocess_specs(opts: Options, rep: RunReport, log_dir: Path) -> list[InprocessSpec]:
    if not opts.inprocess_enabled:
        return []
    specs = [InprocessSpec(label, path) for label, path in opts.inprocess or [("torch", opts.model_dir)]]
    if opts.onnx and not opts.inprocess:
        try:
            specs.append(
                InprocessSpec("onnx", ensure_onnx_export(opts.model_dir, log_dir / "onnx-export.log"))
            )
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            rep.systems.append(
                SystemInfo("inprocess-onnx", "inprocess", "ONNX Runtime in process", reason=str(exc))
            )
    served = served_torch_spec(opts)
    if served is not None and not opts.inprocess:
        specs.append(served)
    return specs


def _service_config(opts: Options) -> dict[str, Any] | None:
    """The (first) service config measured; None when there is none or it is unreadable here."""
    if not opts.services:
        return None
    try:
        return load_config(opts.services[0].config)
    except (OSError, ValueError, yaml.YAMLError) as exc:  # the service run reports it
        print(f"service config unreadable here ({exc})", file=sys.stderr, flush=True)
        return None


def _model_app_args(opts: Options) -> dict[str, Any] | None:
    """The ``args`` of the measured service's model application (the router's default model's, else the
    first ``deployments.app:build_model`` one), with the variant's ``args.`` edits applied; None when
    there is no service config or it serves no model application."""
    from bench.config_edit import ConfigEditError, model_app, with_args

    config = _service_config(opts)
    if config is None:
        return None
    try:
        config = with_args(config, opts.services[0].args)
        return dict(model_app(config).get("args") or {})
    except (ConfigEditError, AttributeError, TypeError) as exc:
        print(f"no model application in the service config ({exc})", file=sys.stderr, flush=True)
        return None


def served_torch_spec(opts: Options) -> InprocessSpec | None:
    """The torch model exactly as the measured service runs it (precision, graph, threads, passes), when
    that differs from the plain torch row: the limit of the served backend, beside ONNX Runtime's.
    Settings the config does not write are the code's defaults (deployments.config)."""
    from deployments.config import ModelAppArgs

    args = _model_app_args(opts)
    if args is None:
        return None
    try:
        app = ModelAppArgs.model_validate(args)
    except ValueError:
        return None
    model, runtime = app.model, app.runtime
    spec = InprocessSpec(
        f"torch-{model.precision}-{runtime.torch_graph}",
        opts.model_dir,
        model.precision,
        runtime.torch_graph,
        runtime.intra_op_threads,
        runtime.parallel_passes,
    )
    if model.backend != "torch" or spec == InprocessSpec(spec.label, opts.model_dir):
        return None
    return spec


def service_micro_batch(opts: Options) -> tuple[int, int]:
    """Sequences and padded tokens per forward pass of the model application's ``Inference`` in the
    (first) service config measured, so the in-process row on W2's requests cuts them as the service
    does; what the config does not write, and everything without a service config, is the code's
    defaults (``BatchingConfig``)."""
    from bench.config_edit import ConfigEditError, user_config_of
    from deployments.user_config import BatchingConfig

    values: dict[str, Any] = {}
    config = _service_config(opts)
    if config is not None:
        try:
            values = user_config_of(config, "Inference")
        except (ConfigEditError, AttributeError, TypeError) as exc:  # the service run reports it
            print(f"micro-batch limits from the code defaults ({exc})", file=sys.stderr, flush=True)
    try:
        batching = BatchingConfig.model_validate(values)
    except ValueError as exc:
        print(f"micro-batch limits from the code defaults ({exc})", file=sys.stderr, flush=True)
        batching = BatchingConfig()
    return batching.micro_batch_size, batching.micro_batch_tokens


def run_inprocess(
    opts: Options, rep: RunReport, corpus: Corpus, check_texts: list[str], log_dir: Path
) -> np.ndarray:
    """Measure the in-process rows in a child process; returns the reference embeddings."""
    specs = inprocess_specs(opts, rep, log_dir)
    request = {
        "specs": [{**asdict(spec), "model_dir": str(spec.model_dir)} for spec in specs],
        "texts": list(corpus.texts),
        "check_texts": check_texts,
        "warmup_s": opts.inprocess_warmup_s,
        "duration_s": opts.inprocess_duration_s,
        "seed": opts.seed,
        "max_other_load": opts.max_other_load,
        "retries": opts.retries,
        "quiet_wait_s": opts.quiet_wait_s,
        "request_texts": opts.w2_texts,
        "micro_batch": service_micro_batch(opts),
    }
    req_file, out_file = log_dir / "inprocess-request.json", log_dir / "inprocess-result.json"
    req_file.write_text(json.dumps(request))
    timeout = 600 + len(specs) * 2 * (opts.inprocess_warmup_s + opts.inprocess_duration_s + 60)
    log_path = log_dir / "inprocess.log"
    try:
        with log_path.open("a") as log:
            subprocess.run(
                [sys.executable, "-m", "bench.inprocess", "--request", str(req_file), "--out", str(out_file)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=True,
            )
        result = json.loads(out_file.read_text())
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        why = f"in-process child failed ({type(exc).__name__}); log: {log_path}"
        print(why, file=sys.stderr, flush=True)
        result = {"points": [], "skipped": {spec.label: why for spec in specs}, "reference": []}
    for spec in specs:
        reason = result["skipped"].get(spec.label, "")
        how = "" if spec == InprocessSpec(spec.label, spec.model_dir) else f" ({_runner_settings(spec)})"
        info = SystemInfo(
            f"inprocess-{spec.label}",
            "inprocess",
            f"tokenize + forward + pool in process: {shown_path(spec.model_dir)}{how}",
            ran=not reason,
            reason=reason,
        )
        rep.systems.append(info)
    for raw in result["points"]:
        point = Point(**raw)
        rep.points.append(point)
        print(report.point_row(point), flush=True)
    return np.asarray(result["reference"], dtype=np.float32)


def _runner_settings(spec: InprocessSpec) -> str:
    threads = "default" if spec.threads is None else spec.threads
    return f"{spec.precision}, {spec.graph}, {spec.parallel} pass(es) x {threads} thread(s), as the service"


def shown_path(path: Path) -> str:
    """``path`` relative to the project root when it lies inside it (reports travel between machines)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)

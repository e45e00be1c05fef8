"""``python -m bench.generate``: the generation benchmark — the design's rows in process, then the same
streamed chat-completion workloads (``bench.generate_workloads``) to this service, vLLM's CPU build,
``transformers serve`` and a naive endpoint, one after the other, in one run; the service also on a
speculative pair without and with its draft model. See bench/README.md ("Generation").

    .venv/bin/python -m bench.generate --rounds 3 --out .bench/generate-rounds --doc docs/benchmarks.md
    .venv/bin/python -m bench.generate --quick --systems service,vllm --out .bench/generate-quick
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import generate_judge as judge
from bench import generate_report as report
from bench import generate_rounds as rounds
from bench import generate_spec as spec
from bench import generate_stats as stats
from bench import generate_systems as systems
from bench import generate_workloads as wl
from bench import machine
from bench.generate_cli import _floats, _systems, _workloads, apply_defaults, estimate_s, plan, workloads_of
from bench.generate_measure import (
    CHECK_MAX_TOKENS,
    WHAT,
    make_workloads,
    measure_system,
    reference_texts,
    start,
)
from bench.service import ROOT

WORK_DIR = ROOT / ".bench"
DEFAULT_MODEL_DIRS = tuple(WORK_DIR / "models" / name / "1" for name in ("bench-gpt2-small", "gpt2-small"))
__all__ = ["_floats", "_systems", "_workloads", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from bench.generate_cli import build_parser as parser

    return parser(__doc__ or "")


def ensure_model(model_dir: Path | None, log: Callable[[str], None]) -> Path:
    """The model dir: the one given, or the bench model (``.bench/models/bench-gpt2-small/1``, or the
    builder's ``gpt2-small``), built on first use with ``deployments.tools.demo_lm``."""
    if model_dir is not None:
        if not (model_dir / "config.json").is_file():
            raise SystemExit(f"error: no model in {model_dir}")
        return model_dir
    found = next((d for d in DEFAULT_MODEL_DIRS if (d / "config.json").is_file()), None)
    if found is not None:
        return found
    log("building the bench model (python -m deployments.tools.demo_lm --preset gpt2-small) ...")
    cmd = [sys.executable, "-m", "deployments.tools.demo_lm", "--preset", "gpt2-small"]
    subprocess.run([*cmd, "--repository", str(WORK_DIR / "models")], cwd=ROOT, check=True, timeout=3600)
    found = next((d for d in DEFAULT_MODEL_DIRS if (d / "config.json").is_file()), None)
    if found is None:
        raise SystemExit(f"error: the builder made none of {[str(d) for d in DEFAULT_MODEL_DIRS]}")
    return found


def model_name(model_dir: Path) -> str:
    """The name in the model's manifest (else its directory's): what the service and naive serve it as."""
    import json

    manifest = model_dir / "manifest.json"
    if manifest.is_file():
        return str(json.loads(manifest.read_text()).get("name") or model_dir.resolve().parent.name)
    return model_dir.resolve().parent.name


def describe_model(model_dir: Path, precision: str = "fp32") -> dict[str, Any]:
    import json

    config = json.loads((model_dir / "config.json").read_text())
    shape = {
        k: config.get(k)
        for k in (
            "model_type",
            "n_layer",
            "num_hidden_layers",
            "n_embd",
            "hidden_size",
            "vocab_size",
            "n_positions",
            "max_position_embeddings",
        )
        if k in config
    }
    text = ", ".join(f"{k} {v}" for k, v in shape.items())
    return {"dir": str(model_dir), "describe": f"`{model_dir}` ({text}), {precision}", **shape}


def _run_system(
    name: str,
    round_no: int,
    ns: argparse.Namespace,
    run: stats.GenReport,
    entries: dict[str, stats.SystemRun],
    pools: dict[str, wl.Workload],
    refs: dict[str, list[str]],
    log_dir: Path,
    log: Callable[[str], None],
) -> list[stats.GenPoint]:
    """Start one system, measure its workloads' points, stop it: its points, marked with the round. A
    failure is reported in its entry (one per system; a later round adds to its note) and the run goes on."""
    entry = entries.get(name)
    if entry is None:
        what = WHAT[name].format(
            config=ns.config,
            version=systems.transformers_version(),
            flags=ns.ts_flags,
            dtype=systems.TS_DTYPES[ns.precision],
        )
        entry = entries[name] = stats.SystemRun(name, what)
        run.systems.append(entry)
    chosen = [pools[w] for w in workloads_of(name, ns.workloads) if w in pools]
    where = f"round {round_no}: " if ns.rounds > 1 else ""
    model_dir = ns.spec_target_dir if name in (spec.SPEC_OFF, spec.SPEC_ON) else ns.model_dir
    key = str(model_dir)
    log(f"{name}: starting ...")
    try:
        if name in (spec.SPEC_OFF, spec.SPEC_ON) and ns.spec_unavailable:
            raise systems.Unavailable(ns.spec_unavailable)
        if key not in refs:  # before the start: the reference's model load is not the server's load
            check = [replace(p, max_tokens=CHECK_MAX_TOKENS) for p in chosen[0].check]
            refs[key] = reference_texts(model_dir, check, ns.precision)
        machine.wait_quiet(0.3, ns.quiet_wait)
        running = start(name, ns, log_dir, entry)
    except Exception as exc:  # reported; the run goes on with the next system
        note = f"{where}did not start: {type(exc).__name__}: {exc}"[:600]
        entry.note = f"{entry.note}; {note}" if entry.note else note
        log(f"  {note}")
        return []
    entry.start_s = entry.start_s if entry.start_s is not None else round(running.start_s, 1)
    log(f"  up in {running.start_s:.0f} s at {running.base_url} (log {running.log})")
    try:
        full = round_no == 1 or ns.full_rounds
        points, note = measure_system(running, chosen, ns, refs[key], log, full)
        entry.ran = True
    except Exception as exc:  # reported; the next system still runs
        points, note = [], f"failed: {type(exc).__name__}: {exc}"[:600]
        log(f"  {note}")
    finally:
        running.stop()
    entry.note = f"{entry.note}; {where}{note}" if entry.note else f"{where}{note}"
    return [replace(p, round=round_no) for p in points]


def _write(run: stats.GenReport, out: Path, doc: Path | None, log: Callable[[str], None]) -> None:
    run.save(out / "results.json")
    points = rounds.median_points(run.points)
    plot = report.plot(points, out / "plot.png", "generation: tokens/s and TTFT") if points else None
    (out / "table.md").write_text(report.render(run, plot.name if plot else None))
    if doc is not None:
        text = doc.read_text() if doc.exists() else ""
        rel = os.path.relpath(plot.resolve(), doc.resolve().parent) if plot else None
        doc.write_text(report.splice_doc(text, report.render(run, rel, level=3)))
    log("\n" + report.ratios_table(run.ratios))
    log(f"\nwrote {out / 'results.json'}, {out / 'table.md'}" + (f", {plot}" if plot else ""))


def redo_design_rows(ns: argparse.Namespace, log: Callable[[str], None]) -> int:
    """The design rows measured again, alone, into the run in ``ns.design_rows_into``; the report says when
    and why (its other rows and points are that run's own)."""
    from bench.generate_inprocess import design_rows_apart

    out = ns.design_rows_into
    run = stats.GenReport.load(out / "results.json")
    model_dir = Path(run.model["dir"])
    precision = str(run.options.get("precision", "fp32"))
    machine.wait_quiet(0.3, ns.quiet_wait)
    before = ", ".join(f"{r.name} {r.seconds:.2f} s (other load {r.other_load})" for r in run.design_rows)
    log(f"design rows again, alone (before: {before}):")
    old = {r.name for r in stats.design_ratios(run.design_rows)}
    run.design_rows = design_rows_apart(model_dir, ns.new_tokens, precision=precision)
    run.options["design_rows_note"] = (
        f"measured again alone at {time.strftime('%Y-%m-%d %H:%M:%S')} "
        f"(`python -m bench.generate --design-rows-into {out}`), checkout "
        f"{machine.machine_info(root=ROOT).get('git', '?')}; in the run itself: {before}"
    )
    run.ratios = stats.design_ratios(run.design_rows) + [r for r in run.ratios if r.name not in old]
    _write(run, out, ns.doc, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = apply_defaults(build_parser().parse_args(argv))

    def log(text: str) -> None:
        print(text, flush=True)

    if ns.design_rows_into is not None:
        return redo_design_rows(ns, log)
    WORK_DIR.mkdir(exist_ok=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    log_dir = WORK_DIR / "logs" / "generate"
    ns.model_dir = ensure_model(ns.model_dir, log)
    ns.service_model = ns.service_model or model_name(ns.model_dir)
    ns.spec_unavailable = ""
    if wl.SPECULATIVE in ns.workloads and systems.SERVICE in ns.systems:
        default_pair = ns.spec_target_dir == build_parser().get_default("spec_target_dir")
        if default_pair:
            ns.spec_target_dir, ns.spec_unavailable = spec.ensure_pair(ns.spec_target_dir.parent.parent, log)
        elif not (ns.spec_target_dir / "config.json").is_file():
            ns.spec_unavailable = f"no model in {ns.spec_target_dir}"
    ns.spec_model = (
        model_name(ns.spec_target_dir) if (ns.spec_target_dir / "config.json").is_file() else spec.TARGET
    )
    pools = make_workloads(ns)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()}
    options.update(warmup_s=ns.warmup, duration_s=ns.duration)
    run = stats.GenReport(
        command="python -m bench.generate " + " ".join(shlex.quote(a) for a in argv),
        machine=machine.machine_info(root=ROOT),
        options=options,
        model=describe_model(ns.model_dir, ns.precision),
        prompts={name: w.info for name, w in pools.items()},
        started_at=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    for name, w in pools.items():
        log(f"{name} prompts: {w.info}")
    steps = plan(ns)
    log(f"plan: {len(steps)} starts, about {estimate_s(ns) / 60:.0f} minutes")
    if not ns.no_design_rows:
        from bench.generate_inprocess import design_rows_apart

        log("design rows (in process, a child process of their own):")
        run.design_rows = design_rows_apart(ns.model_dir, ns.new_tokens, precision=ns.precision)
    entries: dict[str, stats.SystemRun] = {}
    refs: dict[str, list[str]] = {}
    for round_no, name in steps:
        if ns.rounds > 1 and all(n != round_no for n, _ in steps[: steps.index((round_no, name))]):
            log(f"round {round_no} of {ns.rounds}")
        run.points += _run_system(name, round_no, ns, run, entries, pools, refs, log_dir, log)
        run.save(ns.out / "results.json")  # a run cut short keeps what it measured
    run.ratios = stats.design_ratios(run.design_rows) + judge.ratios_over_rounds(
        run.points, ns.rounds, systems.SERVICE, systems.VLLM, systems.TRANSFORMERS_SERVE, systems.NAIVE
    )
    run.finished_at = time.strftime("%Y-%m-%d %H:%M:%S")
    _write(run, ns.out, ns.doc, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

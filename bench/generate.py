"""``python -m bench.generate``: the generation benchmark — the design's rows in process, then the same
streamed chat-completion traffic to this service, ``transformers serve`` and a naive endpoint, one after
the other, in one run. See bench/README.md ("Generation").

    .venv/bin/python -m bench.generate --out .bench/generate --doc docs/benchmarks.md
    .venv/bin/python -m bench.generate --quick --systems naive,transformers-serve --model-dir DIR
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

from bench import generate_load as load
from bench import generate_report as report
from bench import generate_rounds as rounds
from bench import generate_stats as stats
from bench import generate_systems as systems
from bench import machine
from bench.generate_measure import (
    CHECK_MAX_TOKENS,
    CHECK_PROMPTS,
    WHAT,
    build_prompts,
    measure_system,
    reference_texts,
    start,
)
from bench.service import ROOT

WORK_DIR = ROOT / ".bench"
DEFAULT_MODEL_DIRS = tuple(WORK_DIR / "models" / name / "1" for name in ("bench-gpt2-small", "gpt2-small"))
DEFAULT_CONFIG = ROOT / "examples" / "generate.yaml"


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,8,32, got {text!r}")
    return values


def _systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(systems.SYSTEMS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown systems {unknown}; choose from {', '.join(systems.SYSTEMS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__.splitlines()[0])
    p.add_argument(
        "--systems",
        type=_systems,
        default=list(systems.SYSTEMS),
        help="comma-separated, in this order (default service,transformers-serve,naive)",
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the service's Serve config")
    p.add_argument(
        "--service-model",
        default=None,
        help="the model name the service serves (default: the name in the model dir's manifest); a config "
        "without it gets its generate application retargeted to the model dir (written to --out)",
    )
    p.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="environment for the service's Ray processes (repeatable)",
    )
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs the private Ray instance advertises")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="every system's weights and compute: the service's model config, transformers serve's --dtype, "
        "the naive endpoint's, the reference and the design rows (default fp32)",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the model for every system (default .bench/models/bench-gpt2-small/1 or gpt2-small/1, "
        "built on first use)",
    )
    p.add_argument("--serving-venv", type=Path, default=WORK_DIR / "serving-venv")
    p.add_argument(
        "--ts-flags",
        default="--log-level error",
        help="extra flags for transformers serve (default: '--log-level error')",
    )
    p.add_argument(
        "--concurrency",
        type=lambda t: [int(v) for v in _floats(t)],
        default=None,
        help="closed-loop clients per point (default 1,8,32; --quick 1,8)",
    )
    p.add_argument(
        "--open-loop-rates",
        type=_floats,
        default=None,
        help="offered req/s of the open-loop points (default 0.5,1,2; --quick 1)",
    )
    p.add_argument("--no-open-loop", action="store_true")
    p.add_argument(
        "--warmup", type=float, default=None, help="seconds of warm-up per point (default 10; --quick 2)"
    )
    p.add_argument(
        "--duration", type=float, default=None, help="seconds measured per point (default 60; --quick 8)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="start and measure the service and transformers serve this many times, the order alternating "
        "(the naive endpoint once); each ratio is judged on its median over the rounds (default 1)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s warm-up, 8 s per point, fewer points")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--prompts", type=int, default=256, help="size of the prompt mix (default 256)")
    p.add_argument("--max-tokens", default="32,128", help="range of max_tokens per request (default 32,128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-design-rows", action="store_true", help="skip the in-process rows")
    p.add_argument(
        "--design-rows-into",
        type=Path,
        default=None,
        metavar="DIR",
        help="measure the design rows alone into the earlier run in DIR (its results.json), say so in its "
        "report, and write its table.md, plot and --doc again: for rows that other load disturbed",
    )
    p.add_argument("--new-tokens", type=int, default=100, help="new tokens per request in the design rows")
    p.add_argument(
        "--out",
        type=Path,
        default=WORK_DIR / "generate",
        help="directory for results.json, table.md, plot.png (default .bench/generate)",
    )
    p.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="also put the report between the bench-generate markers of this markdown file",
    )
    return p


def ensure_model(model_dir: Path | None, log: Callable[[str], None]) -> Path:
    """The model dir: the one given, or the bench model (``.bench/models/bench-gpt2-small/1``, or the
    builder's ``gpt2-small``), built on first use with ``deployments.repository.demo_lm``."""
    if model_dir is not None:
        if not (model_dir / "config.json").is_file():
            raise SystemExit(f"error: no model in {model_dir}")
        return model_dir
    found = next((d for d in DEFAULT_MODEL_DIRS if (d / "config.json").is_file()), None)
    if found is not None:
        return found
    log("building the bench model (python -m deployments.repository.demo_lm --preset gpt2-small) ...")
    cmd = [sys.executable, "-m", "deployments.repository.demo_lm", "--preset", "gpt2-small"]
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
    prompts: list[load.Prompt],
    refs: list[str],
    log_dir: Path,
    log: Callable[[str], None],
) -> list[stats.GenPoint]:
    """Start one system, measure every point, stop it: its points, marked with the round. A failure is
    reported in its entry (one per system; a later round adds to its note) and the run goes on."""
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
    where = f"round {round_no}: " if ns.rounds > 1 else ""
    log(f"{name}: starting ...")
    machine.wait_quiet(0.3, ns.quiet_wait)
    try:
        running = start(name, ns, log_dir, entry)
    except Exception as exc:  # reported; the run goes on with the next system
        note = f"{where}did not start: {type(exc).__name__}: {exc}"[:600]
        entry.note = f"{entry.note}; {note}" if entry.note else note
        log(f"  {note}")
        return []
    entry.start_s = entry.start_s if entry.start_s is not None else round(running.start_s, 1)
    log(f"  up in {running.start_s:.0f} s at {running.base_url} (log {running.log})")
    try:
        points, note = measure_system(running, prompts, ns, refs, log)
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
        rel = os.path.relpath(plot, doc.parent) if plot else None
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
    ns = build_parser().parse_args(argv)
    ns.warmup = ns.warmup if ns.warmup is not None else (2.0 if ns.quick else 10.0)
    ns.duration = ns.duration if ns.duration is not None else (8.0 if ns.quick else 60.0)
    ns.concurrency = ns.concurrency or ([1, 8] if ns.quick else [1, 8, 32])
    ns.open_loop_rates = (
        [] if ns.no_open_loop else (ns.open_loop_rates or ([1.0] if ns.quick else [0.5, 1.0, 2.0]))
    )
    ns.quiet_wait = 5.0 if ns.quick else 30.0
    lo, _, hi = ns.max_tokens.partition(",")
    budget = (int(lo), int(hi or lo))

    def log(text: str) -> None:
        print(text, flush=True)

    if ns.design_rows_into is not None:
        return redo_design_rows(ns, log)
    WORK_DIR.mkdir(exist_ok=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    log_dir = WORK_DIR / "logs" / "generate"
    ns.model_dir = ensure_model(ns.model_dir, log)
    ns.service_model = ns.service_model or model_name(ns.model_dir)
    prompts, prompt_info = build_prompts(ns.model_dir, ns.prompts, ns.seed, budget)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()}
    options.update(warmup_s=ns.warmup, duration_s=ns.duration)
    run = stats.GenReport(
        command="python -m bench.generate " + " ".join(shlex.quote(a) for a in argv),
        machine=machine.machine_info(root=ROOT),
        options=options,
        model=describe_model(ns.model_dir, ns.precision),
        prompts=prompt_info,
        started_at=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    log(f"prompts: {prompt_info}")
    if not ns.no_design_rows:
        from bench.generate_inprocess import design_rows_apart

        log("design rows (in process, a child process of their own):")
        run.design_rows = design_rows_apart(ns.model_dir, ns.new_tokens, precision=ns.precision)
    refs = reference_texts(
        ns.model_dir, [load.Prompt(p.text, CHECK_MAX_TOKENS) for p in prompts[:CHECK_PROMPTS]], ns.precision
    )
    entries: dict[str, stats.SystemRun] = {}
    for round_no in range(1, ns.rounds + 1):
        if ns.rounds > 1:
            log(f"round {round_no} of {ns.rounds}")
        for name in rounds.systems_in_round(ns.systems, round_no, once=[systems.NAIVE]):
            run.points += _run_system(name, round_no, ns, run, entries, prompts, refs, log_dir, log)
    run.ratios = stats.design_ratios(run.design_rows) + rounds.ratios_over_rounds(
        run.points, ns.rounds, systems.SERVICE, systems.TRANSFORMERS_SERVE, systems.NAIVE
    )
    run.finished_at = time.strftime("%Y-%m-%d %H:%M:%S")
    _write(run, ns.out, ns.doc, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())

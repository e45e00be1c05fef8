"""The command line of ``python -m bench.generate``: its options, their defaults, the run's plan and how
long it takes."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import generate_systems as systems
from bench import generate_workloads as wl
from bench.generate_judge import JUDGED_LEVELS
from bench.generate_rounds import systems_in_round
from bench.generate_spec import DRAFT, DRAFT_TOKENS, SPEC_OFF, SPEC_ON, TARGET
from bench.service import ROOT

WORK_DIR = ROOT / ".bench"
DEFAULT_CONFIG = ROOT / "bench" / "generate_config.yaml"  # the bench model alone, both cores for its engine
ONCE = (systems.TRANSFORMERS_SERVE, systems.NAIVE)  # context peers: the first round only
# Seconds each system took to start in the smokes on the 2-core machine (for the plan's estimate only).
START_S = {
    systems.SERVICE: 55,
    SPEC_OFF: 60,
    SPEC_ON: 60,
    systems.VLLM: 80,
    systems.TRANSFORMERS_SERVE: 30,
    systems.NAIVE: 10,
}
STOP_S = {systems.SERVICE: 15, SPEC_OFF: 15, SPEC_ON: 15}  # Ray's shutdown; the others about 5 s
CHECK_S = 10.0  # the output check: 3 answers of 24 tokens one after the other
DESIGN_ROWS_S = 150.0  # the in-process rows: 100 tokens without a KV cache, with one, 4 batched
POINT_OVERHEAD_S = 3.0  # settling between points (one 2 s sample of the machine's load when it is quiet)


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,8,32, got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    return [int(v) for v in _floats(text)]


def _choices(text: str, known: tuple[str, ...], what: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {', '.join(known)}")
    return names


def _systems(text: str) -> list[str]:
    return _choices(text, systems.SYSTEMS, "systems")


def _workloads(text: str) -> list[str]:
    return _choices(text, wl.WORKLOADS, "workloads")


def build_parser(doc: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.generate", description=doc.splitlines()[0] if doc else None
    )
    add = p.add_argument
    add(
        "--systems",
        type=_systems,
        default=list(systems.SYSTEMS),
        help="default service,vllm,transformers-serve,naive",
    )
    add(
        "--workloads",
        type=_workloads,
        default=list(wl.WORKLOADS),
        help="default unique,shared-prefix,speculative",
    )
    add("--config", type=Path, default=DEFAULT_CONFIG, help="the service's Serve config")
    add(
        "--service-model",
        default=None,
        help="the model name the service serves (default: the name in the model dir's manifest); a config "
        "without it gets its generate application retargeted to the model dir (written to --out)",
    )
    add(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="for the service's Ray processes",
    )
    add("--num-cpus", type=int, default=None, help="CPUs the private Ray instance advertises")
    add(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="every system's weights and compute (default fp32)",
    )
    add("--model-dir", type=Path, default=None, help="the model for every system (default: the bench model)")
    add("--serving-venv", type=Path, default=WORK_DIR / "serving-venv")
    add("--ts-flags", default="--log-level error", help="extra flags for transformers serve")
    add("--vllm-venv", type=Path, default=WORK_DIR / "vllm-venv")
    add("--vllm-flags", default="", help="extra flags for vLLM's API server (default none)")
    add(
        "--vllm-env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="for vLLM (e.g. VLLM_CPU_OMP_THREADS_BIND)",
    )
    add(
        "--spec-target-dir",
        type=Path,
        default=WORK_DIR / "models" / TARGET / "1",
        help=f"the speculative workload's target (default .bench/models/{TARGET}/1, built on first use)",
    )
    add(
        "--spec-draft",
        default=DRAFT,
        help=f"the draft model's name in the target's repository (default {DRAFT})",
    )
    add("--spec-tokens", type=int, default=DRAFT_TOKENS, help="draft tokens per step")
    add("--concurrency", type=_ints, default=None, help="closed-loop clients (default 1,8,32; --quick 1,8)")
    add(
        "--spec-concurrency",
        type=_ints,
        default=None,
        help="speculative workload clients (default 1,8; --quick 1)",
    )
    add("--open-loop-rates", type=_floats, default=None, help="offered req/s (default 0.5,1; --quick 1)")
    add("--no-open-loop", action="store_true")
    add(
        "--full-rounds",
        action="store_true",
        help="every point in every round (default: rounds after the first measure only the closed-loop "
        "levels a judged ratio uses; the open loop and the other levels are context, in the first round)",
    )
    add("--warmup", type=float, default=None, help="seconds of warm-up per point (default 4; --quick 2)")
    add("--duration", type=float, default=None, help="seconds measured per point (default 16; --quick 8)")
    add(
        "--rounds",
        type=int,
        default=1,
        help="start and measure the service, its speculative runs and vLLM this many times, the order "
        "alternating (transformers serve and the naive endpoint once); ratios judged on their medians",
    )
    add("--quick", action="store_true", help="smoke run: 2 s warm-up, 8 s per point, fewer points")
    add("--request-timeout", type=float, default=600.0)
    add("--prompts", type=int, default=1024, help="prompts per workload pool (default 1024)")
    add("--seed", type=int, default=0)
    add("--no-design-rows", action="store_true", help="skip the in-process rows")
    add(
        "--design-rows-into",
        type=Path,
        default=None,
        metavar="DIR",
        help="measure the design rows alone into the earlier run in DIR and write its report again",
    )
    add("--new-tokens", type=int, default=100, help="new tokens per request in the design rows")
    add("--out", type=Path, default=WORK_DIR / "generate", help="results.json, table.md, plot.png")
    add(
        "--doc",
        type=Path,
        default=None,
        help="also put the report between this file's bench-generate markers",
    )
    return p


def apply_defaults(ns: argparse.Namespace) -> argparse.Namespace:
    """Fill the options whose defaults depend on ``--quick``."""
    ns.warmup = ns.warmup if ns.warmup is not None else (2.0 if ns.quick else 4.0)
    ns.duration = ns.duration if ns.duration is not None else (8.0 if ns.quick else 16.0)
    ns.concurrency = ns.concurrency or ([1, 8] if ns.quick else [1, 8, 32])
    ns.spec_concurrency = ns.spec_concurrency or ([1] if ns.quick else [1, 8])
    ns.open_loop_rates = (
        [] if ns.no_open_loop else (ns.open_loop_rates or ([1.0] if ns.quick else [0.5, 1.0]))
    )
    ns.quiet_wait = 5.0 if ns.quick else 30.0
    return ns


def runs(chosen: list[str], workloads: list[str]) -> list[str]:
    """What each round starts, in order: the systems, with the service's two speculative runs after it."""
    out = []
    for name in chosen:
        out.append(name)
        if name == systems.SERVICE and wl.SPECULATIVE in workloads:
            out += [SPEC_OFF, SPEC_ON]
    return out


def workloads_of(run: str, workloads: list[str]) -> list[str]:
    """The workloads a run measures: the speculative runs that one, every other system the rest."""
    if run in (SPEC_OFF, SPEC_ON):
        return [wl.SPECULATIVE] if wl.SPECULATIVE in workloads else []
    return [w for w in workloads if w != wl.SPECULATIVE]


def plan(ns: argparse.Namespace) -> list[tuple[int, str]]:
    """(round, run) in the order they start."""
    order = [n for n in runs(ns.systems, ns.workloads) if workloads_of(n, ns.workloads)]
    return [(r, name) for r in range(1, ns.rounds + 1) for name in systems_in_round(order, r, once=ONCE)]


def estimate_s(ns: argparse.Namespace) -> float:
    """The run's rough length: starts and output checks, points (warm-up + window + settling; an open-loop
    point's drain at most its window again, counted a quarter), the design rows."""
    total = 0.0 if ns.no_design_rows else DESIGN_ROWS_S
    point = ns.warmup + ns.duration + POINT_OVERHEAD_S
    for round_no, name in plan(ns):
        full = round_no == 1 or ns.full_rounds
        total += START_S.get(name, 20) + STOP_S.get(name, 5) + CHECK_S
        for w in workloads_of(name, ns.workloads):
            closed = ns.spec_concurrency if w == wl.SPECULATIVE else ns.concurrency
            judged = JUDGED_LEVELS.get(w, ())
            total += sum(1 for c in closed if full or c in judged) * point
            if w != wl.SPECULATIVE and full:
                total += len(ns.open_loop_rates) * (point + ns.duration / 4)
    return total

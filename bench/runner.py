"""``python -m bench run``: every system on the same corpus and workloads, one after the other.

Order: the in-process rows (a child process), then each HTTP system alone on the machine: this
service's variants, the naive FastAPI endpoint, Infinity with its torch and ONNX engines. Each server
is started, checked against reference embeddings, warmed up and measured per point, then stopped
(always, even on error) before the next one starts.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import (
    infinity,
    loadgen,
    machine,
    mixed,
    mixed_report,
    openloop,
    openloop_report,
    ratios,
    report,
    systems,
)
from bench.cli import WORK_DIR, Options
from bench.inprocess_plan import run_inprocess, served_torch_spec
from bench.results import Point, RunReport, SystemInfo, retry_disturbed
from bench.service import ROOT, load_config
from deployments.tools.corpus import Corpus, batches, build_corpus

CHECK_TEXTS = 8
OPEN_LOOP_PLOT = "open-loop.png"  # beside plot.png


def ensure_work_dir() -> Path:
    WORK_DIR.mkdir(exist_ok=True)
    ignore = WORK_DIR / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# benchmark scratch: virtualenvs, model copies, logs\n*\n")
    return WORK_DIR


def token_counter() -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(systems_model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def systems_model_dir() -> Path:
    from bench.naive_server import default_model_dir

    return default_model_dir()


def prepare_corpus(
    seed: int, limit: int | None = None, max_tokens: int = 256
) -> tuple[Corpus, dict[str, Any]]:
    """The corpus without texts over the model's token limit (the service would refuse them)."""
    tok = token_counter()
    corpus = build_corpus(seed, limit)
    fits = corpus.filtered(lambda t: len(tok.encode(t).ids) <= max_tokens)
    tokens = [len(e.ids) for e in tok.encode_batch(list(fits.texts))]
    stats: dict[str, Any] = dict(fits.stats())
    stats.update(tokens_mean=round(sum(tokens) / len(tokens), 1), tokens_max=max(tokens), seed=seed)
    stats["dropped_over_token_limit"] = len(corpus) - len(fits)
    return fits, stats


def servers(opts: Options, log_dir: Path) -> Iterator[tuple[SystemInfo, systems.Server | None]]:
    """Each HTTP system in turn, with its SystemInfo (a None server: it cannot run; the reason is set)."""
    for variant in opts.services:
        server = systems.ServiceServer(variant, log_dir, opts.num_cpus)
        yield SystemInfo(server.name, "service", server.description), server
    if opts.naive:
        server = systems.naive_server(log_dir)
        yield SystemInfo(server.name, "naive", server.description), server
    wanted = opts.infinity_configs or [c.label for c in infinity.CONFIGS]  # empty: every configuration
    chosen = [c for c in infinity.CONFIGS if opts.with_infinity and c.label in wanted]
    for config in infinity.CONFIGS:
        if config not in chosen:
            why = "not requested (--with-infinity, --infinity-configs)"
            yield SystemInfo(config.label, "infinity", f"Infinity {config.flags}", reason=why), None
    if not chosen:
        return
    try:
        print(f"preparing Infinity in {opts.infinity_venv} (first time: several minutes)", flush=True)
        env = infinity.ensure_venv(opts.infinity_venv, log_dir / "infinity-install.log")
        model = infinity.prepare_model(
            env, systems_model_dir(), WORK_DIR / "infinity-model", log_dir / "infinity-install.log"
        )
    except (infinity.InfinityUnavailable, OSError, subprocess.SubprocessError) as exc:
        print(f"Infinity unavailable: {exc}", file=sys.stderr, flush=True)
        for config in chosen:
            why = f"Infinity unavailable: {exc}"
            yield SystemInfo(config.label, "infinity", f"Infinity {config.flags}", reason=why), None
        return
    for config in chosen:
        server = systems.infinity_server(env, config, model, log_dir)
        yield SystemInfo(server.name, "infinity", server.description), server


def workload_plan(opts: Options, corpus: Corpus) -> list[tuple[str, list[list[str]], int]]:
    singles = [[t] for t in corpus.texts]
    groups = batches(corpus.texts, opts.w2_texts)
    plan = [("W1", singles, c) for c in opts.w1_concurrency]
    return plan + [("W2", groups, c) for c in opts.w2_concurrency]


def measure_server(
    opts: Options,
    rep: RunReport,
    info: SystemInfo,
    server: systems.Server,
    corpus: Corpus,
    check_texts: list[str],
    reference: np.ndarray,
    round_no: int = 1,
) -> None:
    """Start ``server``, check its output, measure every workload point, stop it. A later round adds
    its points (marked with the round) and its notes to the same ``info``."""
    load = machine.wait_quiet()
    if load > 0.25:
        info.reason += f"other load on the machine before start: {load:.0%} of all CPUs. "
    try:
        seconds = server.start()
        print(f"{info.name}: up in {seconds:.1f} s at {server.base_url}", flush=True)
        url = server.base_url + server.embeddings_path
        if len(reference):
            cosine = round(systems.min_cosine(systems.fetch_embeddings(url, check_texts), reference), 6)
            known = info.check_min_cosine
            info.check_min_cosine = cosine if known is None else min(known, cosine)
        target = loadgen.Target(url, systems.MODEL_NAME, opts.encoding_format)
        timing = loadgen.Timing(opts.warmup_s, opts.duration_s, opts.request_timeout_s)
        for workload, groups, conc in workload_plan(opts, corpus):
            requests = loadgen.encode_requests(target, groups)
            once = functools.partial(
                measure_when_quiet,
                opts,
                info.name,
                workload,
                target,
                requests,
                conc,
                timing,
                server.session_id,
            )
            point, errors, taken = retry_disturbed(once, opts.max_other_load, opts.retries)
            if taken > 1:
                print(f"  ({taken} measurements: other processes disturbed the first)", flush=True)
            point = replace(point, round=round_no)
            rep.points.append(point)
            print(report.point_row(point), flush=True)
            if errors:
                where = f"round {round_no} " if opts.rounds > 1 else ""
                info.reason += f"{where}{workload} c={conc} errors, e.g. {errors[0][:160]}. "
        measure_open_loop(opts, rep, info, server, target, corpus, round_no)
        measure_mixed(opts, rep, info, server, target, corpus, round_no)
        info.ran = True
    except Exception as exc:  # one system failing must not stop the others
        info.reason += f"{type(exc).__name__}: {exc}"
        print(f"{info.name}: FAILED: {exc}", file=sys.stderr, flush=True)
    finally:
        server.stop()


def measure_open_loop(
    opts: Options,
    rep: RunReport,
    info: SystemInfo,
    server: systems.Server,
    target: loadgen.Target,
    corpus: Corpus,
    round_no: int,
) -> None:
    """W3 on a started ``server``: single texts of the corpus (mixed lengths) arriving as a Poisson
    process at each offered rate, lowest first; each point judged sustained or not (``openloop.judge``)."""
    requests = loadgen.encode_requests(target, [[t] for t in corpus.texts])
    for rate in opts.open_loop_rates:
        window_s = openloop.window_s(rate, opts.duration_s, opts.open_loop_requests)
        timing = loadgen.Timing(opts.warmup_s, window_s, opts.request_timeout_s)

        def once(rate: int = rate, timing: loadgen.Timing = timing) -> tuple[Point, list[str]]:
            return openloop.measure(
                info.name, target, requests, rate, timing, opts.seed, opts.open_loop_p99_ms, server.session_id
            )

        what = f"{openloop.WORKLOAD} {rate} req/s"
        _take_point(opts, rep, info, server, round_no, once, openloop_report.open_loop_row, what)


def _take_point(
    opts: Options,
    rep: RunReport,
    info: SystemInfo,
    server: systems.Server,
    round_no: int,
    measure: Callable[[], tuple[Point, list[str]]],
    show: Callable[[Point], str],
    what: str,
) -> None:
    """One judged open-loop point: measured once the machine is quiet (again while other processes disturb
    it), kept with its round, printed by ``show``; its errors named in the system's note as ``what``."""

    def once() -> tuple[Point, list[str]]:
        if opts.quiet_wait_s > 0:
            machine.wait_for_quiet(server.session_id, opts.max_other_load, opts.quiet_wait_s)
        return measure()

    point, errors, taken = retry_disturbed(once, opts.max_other_load, opts.retries)
    if taken > 1:
        print(f"  ({taken} measurements: other processes disturbed the first)", flush=True)
    point = replace(point, round=round_no)
    rep.points.append(point)
    print(show(point), flush=True)
    if errors:
        where = f"round {round_no} " if opts.rounds > 1 else ""
        info.reason += f"{where}{what} errors, e.g. {errors[0][:160]}. "


def measure_mixed(
    opts: Options,
    rep: RunReport,
    info: SystemInfo,
    server: systems.Server,
    target: loadgen.Target,
    corpus: Corpus,
    round_no: int,
) -> None:
    """W4 on a started ``server``: requests of mixed sizes (``bench.mixed.MIX``) arriving as a Poisson
    process at ``opts.mixed_rate``, after one request of each large size (first-use costs stay out of the
    window); judged sustained or not by W3's rules."""
    if opts.mixed_rate <= 0:
        return
    for size in sorted({c.high for c in mixed.MIX if c.label != mixed.SMALL}):
        try:
            systems.fetch_embeddings(target.url, corpus.texts[:size], opts.request_timeout_s)
        except Exception as exc:  # the window counts whatever fails; say it here too
            print(f"  W4 priming with {size} texts failed: {type(exc).__name__}: {exc}", flush=True)
    window_s = mixed.window_s(opts.mixed_rate, opts.duration_s, opts.mixed_requests)
    timing = loadgen.Timing(opts.warmup_s, window_s, opts.request_timeout_s)

    def once() -> tuple[Point, list[str]]:
        return mixed.measure(
            info.name,
            target,
            corpus.texts,
            opts.mixed_rate,
            timing,
            opts.seed,
            opts.mixed_p99_ms,
            server.session_id,
        )

    what = f"{mixed.WORKLOAD} {opts.mixed_rate:g} req/s"
    _take_point(opts, rep, info, server, round_no, once, lambda p: mixed_report.mixed_table([p]), what)


def measure_rounds(
    opts: Options,
    rep: RunReport,
    corpus: Corpus,
    check_texts: list[str],
    reference: np.ndarray,
    log_dir: Path,
) -> None:
    """Every HTTP system in turn, ``opts.rounds`` times over: a server's speed varies from one start to
    the next, so several rounds show how much, and the ratios take the median over them."""
    for round_no in range(1, opts.rounds + 1):
        if opts.rounds > 1:
            print(f"round {round_no} of {opts.rounds}", flush=True)
        for fresh, server in servers(opts, log_dir):
            info = rep.system(fresh.name)  # a later round adds to the record of the first
            if info is None:
                info = fresh
                rep.systems.append(info)
            if server is not None:
                measure_server(opts, rep, info, server, corpus, check_texts, reference, round_no)
            rep.save(log_dir / "results-partial.json")


def measure_when_quiet(
    opts: Options,
    system: str,
    workload: str,
    target: loadgen.Target,
    requests: loadgen.Requests,
    concurrency: int,
    timing: loadgen.Timing,
    server_session: int | None,
) -> tuple[Point, list[str]]:
    """Wait (at most a minute) until other processes leave the CPUs alone, then measure one point."""
    if opts.quiet_wait_s > 0:
        machine.wait_for_quiet(server_session, opts.max_other_load, opts.quiet_wait_s)
    return loadgen.measure(
        system, workload, target, requests, concurrency, timing, opts.client_processes, server_session
    )


def _config_or_error(path: Path) -> Any:
    """The service config as measured (it changes between runs), for results.json."""
    try:
        return load_config(path)
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"


def write_outputs(rep: RunReport, out: Path, doc: Path | None = None) -> None:
    from bench.plot import plot_open_loop, plot_run

    out.mkdir(parents=True, exist_ok=True)
    rep.save(out / "results.json")
    names: list[str | None] = []
    for name, draw, wanted in (
        ("plot.png", plot_run, any(p.workload in ("W1", "W2") for p in rep.points)),
        (OPEN_LOOP_PLOT, plot_open_loop, bool(openloop_report.open_loop_points(rep.points))),
    ):
        if wanted:
            draw(rep.points, out / name, title=rep.command)
        else:
            (out / name).unlink(missing_ok=True)  # never leave an older run's plot beside this table
        names.append(name if wanted else None)
    (out / "table.md").write_text(report.render(rep, names[0], open_loop_plot=names[1]))
    if doc is not None:
        plot, loop = (os.path.relpath(out / n, doc.parent) if n else None for n in names)
        old = doc.read_text() if doc.is_file() else ""
        doc.write_text(report.splice_doc(old, report.render(rep, plot, level=3, open_loop_plot=loop)))


def run(opts: Options) -> RunReport:
    ensure_work_dir()
    log_dir = WORK_DIR / "logs" / time.strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    corpus, corpus_stats = prepare_corpus(opts.seed, opts.corpus_limit)
    options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()}
    options["services"] = [
        {"name": s.name, "config": str(s.config), "env": s.env, "content": _config_or_error(s.config)}
        for s in opts.services
    ]
    rep = RunReport(
        opts.command,
        machine.machine_info(root=ROOT),
        options,
        corpus_stats,
        started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    print(f"corpus: {corpus_stats}\nlogs: {log_dir}", flush=True)
    check_texts = [*corpus.texts[:CHECK_TEXTS], max(corpus.texts, key=len)]
    reference = run_inprocess(opts, rep, corpus, check_texts, log_dir)
    measure_rounds(opts, rep, corpus, check_texts, reference, log_dir)
    if any(s.kind == "infinity" and s.ran for s in rep.systems):
        rep.machine["versions"] += f", infinity-emb {infinity.INFINITY_VERSION} (own venv)"
    served = served_torch_spec(opts)
    rep.ratios = ratios.ratios_over_rounds(
        rep,
        [s.name for s in opts.services],
        max_other_load=opts.max_other_load,
        served_inprocess=f"inprocess-{served.label}" if served else None,
        open_loop_rates=opts.open_loop_rates,
        closed_loop=bool(opts.w1_concurrency or opts.w2_concurrency),
        mixed_sizes=opts.mixed_rate > 0,
    )
    rep.finished_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    write_outputs(rep, opts.out, opts.doc)
    if mixed_report.mixed_points(rep.points):
        print("\n" + mixed_report.side_by_side(rep, [s.name for s in opts.services]), flush=True)
    print("\n" + report.ratios_table(rep.ratios), flush=True)
    written = sorted(
        p.name
        for p in opts.out.iterdir()
        if p.name in ("results.json", "table.md", "plot.png", OPEN_LOOP_PLOT)
    )
    print(
        f"\nwrote {', '.join(written)} to {opts.out}" + (f", and {opts.doc}" if opts.doc else ""), flush=True
    )
    return rep

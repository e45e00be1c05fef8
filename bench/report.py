"""Markdown rendering of a run, and the ratios the issue asks for, all from the same run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bench.results import Point, Ratio, RunReport, SystemInfo, is_same_requests_row

INPROCESS_ONNX = "inprocess-onnx"
CONTEXT = "(context)"  # a ratio shown to explain others, with no target of its own


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def points_table(points: Sequence[Point], with_round: bool = False) -> str:
    """One row per point: req/s, sequences/s, latency percentiles, errors, client CPU (and which start
    of its system, for a run of several rounds)."""
    round_col = "| round " if with_round else ""
    header = (
        f"| system {round_col}| workload | concurrency | texts/req | req/s | seq/s "
        "| p50 ms | p90 ms | p99 ms | errors | requests | client CPU | other load |"
    )
    lines = [header, "|" + "---|" * (14 if with_round else 13)]
    for p in points:
        cpu = "-" if p.client_cpu is None else f"{p.client_cpu * 100:.0f} %"
        other = "-" if p.other_load is None else f"{p.other_load * 100:.0f} %"
        cell = f" {p.round} |" if with_round else ""
        lines.append(
            f"| {p.system} |{cell} {p.workload} | {p.concurrency} | {p.texts_per_request} "
            f"| {_num(p.req_per_s)} | {_num(p.seq_per_s)} | {_num(p.p50_ms)} | {_num(p.p90_ms)} "
            f"| {_num(p.p99_ms)} | {p.errors} "
            f"| {p.requests} | {cpu} | {other} |"
        )
    return "\n".join(lines)


def point_row(p: Point) -> str:
    """One point as a row of ``points_table`` (printed as each point is measured)."""
    return points_table([p]).splitlines()[-1]


def systems_table(systems: Sequence[SystemInfo]) -> str:
    lines = [
        "| system | what | ran | output check (min cosine vs reference) | note |",
        "|---|---|---|---|---|",
    ]
    for s in systems:
        check = "-" if s.check_min_cosine is None else f"{s.check_min_cosine:.5f}"
        if s.check_min_cosine is not None and s.check_min_cosine < 0.99:
            check += " **WRONG OUTPUT**"
        note = s.reason.replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {s.name} | {s.description} | {'yes' if s.ran else 'no'} | {check} | {note} |")
    return "\n".join(lines)


def _why_missing(report: RunReport, system: str) -> str:
    info = report.system(system)
    if info is None:
        return f"{system} was not part of this run"
    return f"{system} did not run: {info.reason}" if not info.ran else f"{system} has no such point"


def _disturbed(points: Sequence[Point], max_other_load: float) -> str:
    bad = [p for p in points if p.other_load is not None and p.other_load > max_other_load]
    if not bad:
        return ""
    return "; DISTURBED: " + ", ".join(f"{p.system} {p.workload} other load {p.other_load:.0%}" for p in bad)


Named = tuple[str, Point | None]  # a system's name and its point (None: missing, the name says whose)


def _compare(
    report: RunReport,
    name: str,
    pair: tuple[Named, Named],
    metric: str,
    target: float | None,
    max_other_load: float,
    higher_is_better: bool = True,
) -> Ratio:
    """``metric`` of the first point over the second's, against ``target`` (None: shown for context,
    no target); the detail names the inputs, or why one is missing, and any point measured while
    other processes loaded the machine."""
    (num_sys, num), (den_sys, den) = pair
    want = CONTEXT if target is None else f">= {target:g}" if higher_is_better else f"<= {target:g}"
    if num is None or den is None:
        return Ratio(name, None, want, None, _why_missing(report, num_sys if num is None else den_sys))
    a, b = getattr(num, metric), getattr(den, metric)
    unit = {"seq_per_s": "seq/s", "req_per_s": "req/s", "p99_ms": "ms p99"}[metric]
    detail = (
        f"{a} / {b} {unit} ({num.system} {num.workload} c={num.concurrency} vs "
        f"{den.system} {den.workload} c={den.concurrency})" + _disturbed([num, den], max_other_load)
    )
    if a is None or not b:
        return Ratio(name, None, want, None, detail)
    value = round(a / b, 2)
    return Ratio(name, value, want, _meets(value, want), detail)


def _best(report: RunReport, kind: str, workload: str, metric: str, conc: int | None = None) -> Named:
    """The point of ``workload`` (at ``conc``) with the highest ``metric`` among the systems of ``kind``
    that ran; if none did, the last such system, to say why it is missing."""
    names = [s.name for s in report.systems if s.kind == kind]
    points = [p for n in names if (p := report.point(n, workload, conc)) and getattr(p, metric)]
    if not points:
        return (names[-1] if names else f"any {kind} system", None)
    best = max(points, key=lambda p: getattr(p, metric))
    return best.system, best


def compute_ratios(
    report: RunReport,
    service_names: Sequence[str],
    w1_conc: int = 8,
    max_other_load: float = 0.1,
    served_inprocess: str | None = None,
) -> list[Ratio]:
    """Per service variant: against Infinity's best configuration for each workload (the fastest of its
    engines and dtypes in this run), against the in-process ONNX Runtime limit (its best row), and, for
    context, against the model alone on W2's requests (run as the service runs it: ``served_inprocess``,
    when that system was measured; ONNX Runtime otherwise) and the fastest in-process row of any backend."""
    inf_w2 = _best(report, "infinity", "W2", "seq_per_s")
    inf_w1 = _best(report, "infinity", "W1", "req_per_s", w1_conc)
    onnx_rows = [p for p in report.points if p.system == INPROCESS_ONNX]
    limit = (INPROCESS_ONNX, max(onnx_rows, key=lambda p: p.seq_per_s, default=None))
    # The model alone on W2's own requests, one at a time: how much of the gap to the limit is serving.
    alone = served_inprocess if served_inprocess and report.system(served_inprocess) else INPROCESS_ONNX
    rows = [p for p in report.points if p.system == alone and is_same_requests_row(p.workload)]
    same_requests = (alone, rows[0] if rows else None)
    inprocess = [p for p in report.points if (info := report.system(p.system)) and info.kind == "inprocess"]
    top = max(inprocess, key=lambda p: p.seq_per_s, default=None)
    fastest = (top.system if top else INPROCESS_ONNX, top)
    ratios: list[Ratio] = []
    for name in service_names:
        w2 = (name, report.point(name, "W2"))
        w1 = (name, report.point(name, "W1", w1_conc))
        lim = max_other_load
        ratios += [
            _compare(
                report, f"{name} W2 seq/s ÷ Infinity's best W2 seq/s", (w2, inf_w2), "seq_per_s", 2.0, lim
            ),
            _compare(report, f"{name} W2 seq/s ÷ in-process ONNX limit", (w2, limit), "seq_per_s", 0.8, lim),
            _compare(
                report,
                f"{name} W2 seq/s ÷ the model alone on W2's requests",
                (w2, same_requests),
                "seq_per_s",
                None,
                lim,
            ),
            _compare(
                report, f"{name} W2 seq/s ÷ fastest in-process row", (w2, fastest), "seq_per_s", None, lim
            ),
            _compare(
                report, f"{name} W1 c={w1_conc} req/s ÷ Infinity's best", (w1, inf_w1), "req_per_s", 1.0, lim
            ),
            _compare(
                report,
                f"{name} W1 c={w1_conc} p99 ÷ that Infinity's p99",
                (w1, inf_w1),
                "p99_ms",
                1.0,
                lim,
                False,
            ),
        ]
    return ratios


def ratios_over_rounds(report: RunReport, service_names: Sequence[str], **kwargs: Any) -> list[Ratio]:
    """``compute_ratios`` for a run of one round. For several rounds (each HTTP system started once per
    round), every ratio within each round, and first the median of each over the rounds, judged against
    the target: one start of a server can be 10-20 % faster or slower than the next on a small machine,
    and a ratio from one start of each side falls either side of its target by chance when both are close."""
    rounds = report.rounds
    if rounds == 1:
        return compute_ratios(report, service_names, **kwargs)
    each = [compute_ratios(report.in_round(r), service_names, **kwargs) for r in range(1, rounds + 1)]
    medians: list[Ratio] = []
    for i, first in enumerate(each[0]):
        values = [ratios[i].value for ratios in each]
        known = [v for v in values if v is not None]
        listed = ", ".join("n/a" if v is None else f"{v:.2f}" for v in values)
        if not known:
            medians.append(Ratio(first.name, None, first.target, None, f"in no round: {first.detail}"))
            continue
        value = round(statistics.median(known), 2)
        detail = f"median of {len(known)} of {rounds} rounds ({listed})"
        medians.append(Ratio(first.name, value, first.target, _meets(value, first.target), detail))
    per_round = [
        replace(r, name=f"round {n}: {r.name}") for n, ratios in enumerate(each, start=1) for r in ratios
    ]
    return medians + per_round


def _meets(value: float, target: str) -> bool | None:
    """``value`` against a target as the tables write it (``>= 2``, ``<= 1``); None for context rows.
    The one place a ratio is judged: within a round and for the median over rounds."""
    op, _, bound = target.partition(" ")
    if op == ">=":
        return value >= float(bound)
    if op == "<=":
        return value <= float(bound)
    return None


def ratios_table(ratios: Sequence[Ratio]) -> str:
    lines = ["| ratio | value | target | met | from |", "|---|---|---|---|---|"]
    for r in ratios:
        met = "-" if r.target == CONTEXT else "n/a" if r.met is None else "yes" if r.met else "**no**"
        value = "n/a" if r.value is None else f"{r.value:.2f}"
        lines.append(f"| {r.name} | {value} | {r.target} | {met} | {r.detail} |")
    return "\n".join(lines)


def _disturbance_note(report: RunReport) -> list[str]:
    limit = float(report.options.get("max_other_load", 0.1))
    bad = [p for p in report.points if p.other_load is not None and p.other_load > limit]
    if not bad:
        return []
    return [
        f"**{len(bad)} of {len(report.points)} points were measured while other processes used more than "
        f'{limit:.0%} of the CPUs** (column "other load"; the least disturbed of '
        f"{1 + int(report.options.get('retries', 0))} tries is shown): their numbers are lower than this "
        "machine can do. Re-run on a quiet machine before drawing conclusions from them.",
        "",
    ]


def _rounds_note(report: RunReport) -> list[str]:
    rounds = report.rounds
    if rounds == 1:
        return []
    return [
        f"Every HTTP system was started and measured {rounds} times, one round after the other "
        '(column "round" above). The first rows give each ratio\'s median over the rounds, judged against '
        'its target; "round N:" rows the ratio within each round, against the best Infinity configuration '
        "of that round.",
        "",
    ]


def render(report: RunReport, plot_name: str | None = "plot.png", level: int = 2) -> str:
    """The whole report as markdown: machine, systems, points, ratios, plot."""
    m = report.machine
    corpus = report.corpus
    h = "#" * level
    parts = [
        f"Command: `{report.command}`",
        "",
        f"Run: {report.started_at} → {report.finished_at}, checkout {m.get('git', '?')}. "
        f"Machine: {m.get('cpu_model', '?')}, "
        f"{m.get('nproc', '?')} CPUs, {m.get('ram_gib', '?')} GiB RAM; {m.get('versions', '')}.",
        "",
        f"Corpus: {corpus.get('texts')} texts of real English prose (Python's reference docs), "
        f"{corpus.get('words_mean')} words on average (min {corpus.get('words_min')}, median "
        f"{corpus.get('words_p50')}, p90 {corpus.get('words_p90')}, max {corpus.get('words_max')}); "
        f"{corpus.get('tokens_mean', '?')} tokens on average.",
        "",
        f"{h} Systems",
        "",
        systems_table(report.systems),
        "",
        f"{h} Results",
        "",
        *_disturbance_note(report),
        points_table(report.points, with_round=report.rounds > 1),
        "",
        f"{h} Ratios (same run)",
        "",
        *_rounds_note(report),
        ratios_table(report.ratios),
    ]
    if plot_name:
        parts += ["", f"![latency against throughput]({plot_name})"]
    return "\n".join(parts) + "\n"


BEGIN_MARK = "<!-- bench:begin (generated by python -m bench run --doc; edits inside are overwritten) -->"
END_MARK = "<!-- bench:end -->"


def splice_doc(doc: str, generated: str) -> str:
    """``doc`` with the text between the bench markers replaced by ``generated`` (appended if absent)."""
    block = f"{BEGIN_MARK}\n{generated.rstrip()}\n{END_MARK}"
    start, end = doc.find("<!-- bench:begin"), doc.find(END_MARK)
    if start == -1 or end == -1 or end < start:
        return doc.rstrip() + "\n\n" + block + "\n"
    return doc[:start] + block + doc[end + len(END_MARK) :]

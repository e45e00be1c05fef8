"""Markdown rendering of a run: machine, systems, points, the open loop, ratios (``bench.ratios``)."""

from __future__ import annotations

from collections.abc import Sequence

from bench import mixed_report, openloop_report
from bench.ratios import CONTEXT
from bench.results import Point, Ratio, RunReport, SystemInfo


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


def render(
    report: RunReport, plot_name: str | None = "plot.png", level: int = 2, open_loop_plot: str | None = None
) -> str:
    """The whole report as markdown: machine, systems, points (each open-loop workload's in a table of
    its own), ratios, plots."""
    open_loops = (openloop_report.WORKLOAD, mixed_report.WORKLOAD)
    closed = [p for p in report.points if p.workload not in open_loops]
    services = [s.name for s in report.systems if s.kind == "service"]
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
        points_table(closed, with_round=report.rounds > 1),
        "",
        *openloop_report.open_loop_section(report, f"{h} Open loop (W3)", open_loop_plot),
        *mixed_report.mixed_section(report, f"{h} Mixed request sizes, open loop (W4)", services),
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
    return splice_between(doc, generated, BEGIN_MARK, END_MARK)


def splice_between(doc: str, generated: str, begin_mark: str, end_mark: str) -> str:
    """``doc`` with the text between one benchmark's markers replaced (appended if absent). A begin marker
    is found by its text up to its first space after the name, so a changed explanation still matches."""
    block = f"{begin_mark}\n{generated.rstrip()}\n{end_mark}"
    start, end = doc.find(begin_mark.split(" (", 1)[0]), doc.find(end_mark)
    if start == -1 or end == -1 or end < start:
        return doc.rstrip() + "\n\n" + block + "\n"
    return doc[:start] + block + doc[end + len(end_mark) :]

"""The ratios the service is held to, all from the same run, and their medians over rounds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from bench import mixed, openloop
from bench.mixed_report import best_infinity, class_stats, errors_cell, small_p99
from bench.openloop_report import best_sustaining
from bench.results import Point, Ratio, RunReport, is_same_requests_row

INPROCESS_ONNX = "inprocess-onnx"
CONTEXT = "(context)"  # a ratio shown to explain others, with no target of its own


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
        missing = [_why_missing(report, n) for n, p in ((num_sys, num), (den_sys, den)) if p is None]
        return Ratio(name, None, want, None, "; ".join(missing))
    a, b = getattr(num, metric), getattr(den, metric)
    unit = {"seq_per_s": "seq/s", "req_per_s": "req/s", "p50_ms": "ms p50", "p99_ms": "ms p99"}[metric]
    detail = f"{a} / {b} {unit} ({_where(num)} vs {_where(den)})" + _disturbed([num, den], max_other_load)
    if metric == "p99_ms":
        detail += _p99_intervals(pair)
    if a is None or not b:
        return Ratio(name, None, want, None, detail)
    value = round(a / b, 2)
    return Ratio(name, value, want, meets(value, want), detail)


def _where(p: Point) -> str:
    """A point as a ratio's detail names it: its load is a concurrency, or (open loop) an offered rate."""
    load = f"at {p.concurrency} req/s" if p.workload == openloop.WORKLOAD else f"c={p.concurrency}"
    return f"{p.system} {p.workload} {load}"


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
    open_loop_rates: Sequence[int] = (),
    closed_loop: bool = True,
    mixed_sizes: bool = False,
) -> list[Ratio]:
    """Per service variant: against Infinity's best configuration for each workload (the fastest of its
    engines and dtypes in this run), against the in-process ONNX Runtime limit (its best row), and, for
    context, against the model alone on W2's requests (run as the service runs it: ``served_inprocess``,
    when that system was measured; ONNX Runtime otherwise) and the fastest in-process row of any backend.
    ``closed_loop`` False: no W1/W2 rows (the run measured neither); ``mixed_sizes``: W4's rows."""
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
    inf_open = best_sustaining(report)
    inf_mixed = best_infinity(report)
    ratios: list[Ratio] = []
    lim = max_other_load
    for name in service_names:
        w2 = (name, report.point(name, "W2"))
        w1 = (name, report.point(name, "W1", w1_conc))
        closed = [
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
        if w1_conc != 1:  # single texts one at a time: nothing to batch, so all per-request overhead
            w1_one = (name, report.point(name, "W1", 1))
            inf_one = _best(report, "infinity", "W1", "req_per_s", 1)
            label = f"{name} W1 c=1 req/s ÷ Infinity's best"
            closed.append(_compare(report, label, (w1_one, inf_one), "req_per_s", 1.0, lim))
        ratios += closed if closed_loop else []
        ratios += _open_loop_ratios(report, name, open_loop_rates, inf_open, lim)
        if mixed_sizes:
            ratios += _mixed_ratios(report, name, inf_mixed, lim)
    return ratios


def _mixed_ratios(report: RunReport, name: str, inf: Named, max_other_load: float) -> list[Ratio]:
    """W4 against Infinity's best W4 configuration (``mixed_report.best_infinity``) at the same offered
    load: texts/s (>= 1), the 1-4-text requests' p99 (<= 1), and the service's errors, held to 0 where
    that configuration had none (elsewhere no bar: the row says so)."""
    mine = report.point(name, mixed.WORKLOAD)
    theirs = inf[1]
    labels = (f"{name} W4 texts/s ÷ Infinity's", f"{name} W4 1-4-text p99 ÷ Infinity's")
    errors_label = f"{name} W4 errors (0 where Infinity has 0)"
    if mine is None or theirs is None:
        missing = "; ".join(_why_missing(report, n) for n, p in ((name, mine), inf) if p is None)
        return [
            Ratio(label, None, t, None, missing)
            for label, t in zip((*labels, errors_label), (">= 1", "<= 1", "<= 0"), strict=True)
        ]
    where = f"({name} vs {inf[0]} at {mine.setting.get('offered_req_per_s')} req/s)"
    where += _disturbed([mine, theirs], max_other_load)
    for p in (mine, theirs):
        if not openloop.sustained(p):
            where += f"; {p.system} did not sustain it: {p.setting.get('why', '')}"
    out = []
    intervals = _p99_intervals(((name, _small(mine)), (inf[0], _small(theirs))))
    for label, a, b, unit, target in (
        (labels[0], mine.seq_per_s, theirs.seq_per_s, "texts/s", ">= 1"),
        (labels[1], small_p99(mine), small_p99(theirs), "ms p99 of 1-4-text requests", "<= 1"),
    ):
        value = None if a is None or not b else round(a / b, 2)
        # None of the service's own (no 1-4-text request answered) against a figure of Infinity's: missed.
        met = (False if a is None and b is not None else None) if value is None else meets(value, target)
        detail = f"{a} / {b} {unit} {where}" + (intervals if unit.startswith("ms") else "")
        out.append(Ratio(label, value, target, met, detail))
    errors = (
        f"{name} {errors_cell(mine.errors, mine.setting.get('errors_by_status'))}, "
        f"{inf[0]} {errors_cell(theirs.errors, theirs.setting.get('errors_by_status'))} {where}"
    )
    if theirs.errors:
        out.append(Ratio(errors_label, None, "<= 0", None, f"{inf[0]} had errors: no bar here; {errors}"))
    else:
        out.append(Ratio(errors_label, float(mine.errors), "<= 0", mine.errors == 0, errors))
    return out


def _small(p: Point) -> Point:
    """``p`` with its p99 interval that of its 1-4-text requests (for ``_p99_intervals``)."""
    stats = class_stats(p, mixed.SMALL)
    return replace(p, p99_low_ms=stats.get("p99_low_ms"), p99_high_ms=stats.get("p99_high_ms"))


def _open_loop_ratios(
    report: RunReport, name: str, rates: Sequence[int], inf: Named, max_other_load: float
) -> list[Ratio]:
    """Per offered rate, the service's p50 and p99 over those of Infinity's best open-loop configuration
    at that rate (``openloop_report.best_sustaining``), held to <= 1 only where that configuration
    sustained the rate (elsewhere the row says why there is no bar)."""
    out: list[Ratio] = []
    for rate in rates:
        mine = report.point(name, openloop.WORKLOAD, rate)
        theirs = report.point(inf[0], openloop.WORKLOAD, rate)
        for metric in ("p50_ms", "p99_ms"):
            label = f"{name} W3 {rate} req/s {metric[:3]} ÷ Infinity's best"
            if theirs is not None and not openloop.sustained(theirs):
                why = f"{inf[0]} did not sustain {rate} req/s ({theirs.setting.get('why', '')}): no bar here"
                out.append(Ratio(label, None, "<= 1", None, why))
                continue
            pair = ((name, mine), (inf[0], theirs))
            ratio = _compare(report, label, pair, metric, 1.0, max_other_load, False)
            if mine is not None and not openloop.sustained(mine):
                ratio.detail += f"; {name} did not sustain it: {mine.setting.get('why', '')}"
                ratio.met = False if ratio.value is None and theirs is not None else ratio.met
            out.append(ratio)
    return out


def _p99_intervals(pair: tuple[Named, Named]) -> str:
    """Both p99s' 95 % intervals (``results.percentile_interval``), and whether they are apart: where they
    overlap, a run of this many arrivals cannot say which system's p99 is lower."""
    (a, mine), (b, theirs) = pair
    if mine is None or theirs is None:
        return ""
    a_low, a_high, b_low, b_high = mine.p99_low_ms, mine.p99_high_ms, theirs.p99_low_ms, theirs.p99_high_ms
    if a_low is None or a_high is None or b_low is None or b_high is None:
        return ""
    apart = a_low > b_high or b_low > a_high
    verdict = "apart" if apart else "overlapping: this run does not tell them apart"
    return f"; p99 95 % intervals {a} {a_low:g}-{a_high:g} ms, {b} {b_low:g}-{b_high:g} ms ({verdict})"


def ratios_over_rounds(report: RunReport, service_names: Sequence[str], **kwargs: Any) -> list[Ratio]:
    """``compute_ratios`` for a run of one round. For several rounds (each HTTP system started once per
    round), every ratio within each round, and first the median of each over the rounds, judged against
    the target: one start of a server can be 10-20 % faster or slower than the next on a small machine,
    and a ratio from one start of each side falls either side of its target by chance when both are close."""
    rounds = report.rounds
    if rounds == 1:
        return compute_ratios(report, service_names, **kwargs)
    each = [compute_ratios(report.in_round(r), service_names, **kwargs) for r in range(1, rounds + 1)]
    return medians_over_rounds(each)


class _RatioLike(Protocol):
    name: str
    value: float | None
    target: str
    met: bool | None
    detail: str


R = TypeVar("R", bound=_RatioLike)


def medians_over_rounds(each: Sequence[Sequence[R]], digits: int = 2) -> list[R]:
    """Each ratio's median over the rounds that have it (matched by name), judged against its target,
    then every round's own ratios, named by round. ``each``: one list of ratios per round. The encoders'
    and the generation benchmark's ratios both go through here."""
    order: list[str] = []
    for ratios in each:
        order += [r.name for r in ratios if r.name not in order]
    medians: list[R] = []
    for name in order:
        found = [next((r for r in ratios if r.name == name), None) for ratios in each]
        first = next(r for r in found if r is not None)
        values = [None if r is None else r.value for r in found]
        known = [v for v in values if v is not None]
        if not known:
            medians.append(replace(first, value=None, met=None, detail=f"in no round: {first.detail}"))
            continue
        value = round(statistics.median(known), digits)
        listed = ", ".join("n/a" if v is None else f"{v:.2f}" for v in values)
        detail = f"median of {len(known)} of {len(each)} rounds ({listed})"
        medians.append(replace(first, value=value, met=meets(value, first.target), detail=detail))
    per_round = [
        replace(r, name=f"round {n}: {r.name}") for n, ratios in enumerate(each, start=1) for r in ratios
    ]
    return medians + per_round


def meets(value: float, target: str) -> bool | None:
    """``value`` against a target as the tables write it (``>= 2``, ``<= 1``); None for context rows.
    The one place a ratio is judged: within a round and for the median over rounds."""
    op, _, bound = target.partition(" ")
    if op == ">=":
        return value >= float(bound)
    if op == "<=":
        return value <= float(bound)
    return None

